"""The stock cache and the ``gather`` backend, every sample in one padded batch.

Every case's prompt is one row of a right-padded batch: each prompt from position 0, its pads
after it, masked by the attention mask. The prompts' shared prefix therefore sits at the same
positions in every row, and its K/V come out of every row the same (with left padding they
would differ in the last bits, the rows' attention sums running over other offsets). After the
prompt's forward each row is repeated for its case's samples, and every row decodes one token
per forward, each new token after the row's pads, its position continuing its prompt's.

Two memories run the same loop. ``StockMemory`` is the reference: transformers' own
``DynamicCache``. ``PoolMemory`` keeps the K/V in an allocator's pools (the real executor's
``KVMemory``, block tables scattered): each layer writes its new tokens through the allocator's
slots and hands the model's own SDPA the padded contiguous K/V gathered back through the block
tables. Its pad positions hold zeros, not the pad token's K/V as the stock cache's do; the mask
gives them probability exactly 0, so SDPA computes the same outputs from the same real K/V and
the logits are bit-identical (with ``paged_prefix`` a prompt reads the shared tokens' K/V
another row wrote, which the padding keeps equal to its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from kvbench.allocators import make_allocator
from kvbench.allocators.base import Allocator
from kvbench.executors.forward import model_kv_shape, slots_of
from kvbench.executors.kv_memory import KVMemory
from kvbench.tasks.equivalence.cases import PromptCase, Trajectory, choose_token
from kvbench.tasks.equivalence.stock_runner import cache_kwarg
from kvbench.tasks.equivalence.trajectories import (
    SampleKey,
    as_trajectories,
    fed_token,
    record_step,
    scramble_free_blocks,
)

# Any id: pad positions are masked; transformers' generate pads with the model's pad token.
_PAD_ID = 0


class StockMemory:
    """transformers' ``DynamicCache``: the reference the other runs are compared with."""

    def __init__(self, model: Any) -> None:
        self.cache = DynamicCache(config=model.config)

    def start(self, cases: Sequence[PromptCase], num_decode_steps: int, width: int) -> None:
        """Nothing to place: the cache grows as the prompts run."""

    def fork(self, rows: Sequence[SampleKey], cases: Sequence[PromptCase]) -> None:
        """Repeat each case's row for its samples (rows in ``rows`` order)."""
        case_rows = {case.prompt_id: index for index, case in enumerate(cases)}
        self.cache.batch_select_indices(torch.tensor([case_rows[key[0]] for key in rows]))

    def grow(self) -> None:
        """Nothing to place: the cache appends the next token's K/V itself."""


class PoolMemory:
    """An allocator's pools as the model's cache (module docstring).

    Args:
        model: the transformers causal LM.
        allocator_name: ``paged`` or ``paged_prefix``.
        pool_blocks: blocks in the pool.
        block_size: tokens per block.
        seed: the order the free blocks are scrambled into (block tables scatter).
        kv_dtype, calibrate_scales: the pools' storage (``KVMemory``; fp8 K/V reach SDPA
            dequantized).
    """

    def __init__(self, model: Any, allocator_name: str, pool_blocks: int, block_size: int,
                 seed: int, kv_dtype: torch.dtype | None = None,
                 calibrate_scales: bool = False) -> None:  # fmt: skip
        self.allocator: Allocator = make_allocator(
            allocator_name, pool_blocks * block_size, block_size,
            model.config.max_position_embeddings,
        )  # fmt: skip
        scramble_free_blocks(self.allocator, seed)
        num_layers, num_kv_heads, head_dim = model_kv_shape(model)
        self.memory = KVMemory(num_layers, num_kv_heads, head_dim, self.allocator.num_slots,
                               block_size, model.dtype, kv_dtype=kv_dtype,
                               calibrate_scales=calibrate_scales)  # fmt: skip
        self.cache = Cache(layers=[_PoolLayer(self, layer) for layer in range(num_layers)])
        self.seq_ids: list[int] = []  # per row
        self.prompt_lens: list[int] = []  # per row
        self.prompt_width = 0  # the padded prompts' width: a row's pads follow its prompt to it
        self.write_slots = torch.empty(0, dtype=torch.int64)  # [rows * new tokens], -1: skip
        self.read_slots = torch.empty(0, 0, dtype=torch.int64)  # [rows, width], -1: a pad

    def start(self, cases: Sequence[PromptCase], num_decode_steps: int, width: int) -> None:
        """Admit each case's first sequence (a ``paged_prefix`` hit finds the shared tokens in an
        earlier row's blocks, written in the same layer pass before any row reads them)."""
        num_cached = []
        for case in cases:
            seq_id = case.seq_id(0)
            if not self.allocator.admit(seq_id, case.request(num_decode_steps),
                                        len(case.token_ids)):  # fmt: skip
                raise RuntimeError(f"pool too small: cannot admit prompt {case.prompt_id}")
            prefix_cache = self.allocator.prefix_cache
            num_cached.append(prefix_cache.cached_prefix_tokens(seq_id) if prefix_cache else 0)
            self.seq_ids.append(seq_id)
            self.prompt_lens.append(len(case.token_ids))
        self.prompt_width = width
        self.read_slots = self._read_slots()
        write_slots = self.read_slots.clone()  # [cases, width]
        # Every token is computed (as in the stock cache), but a shared block keeps the K/V its
        # first writer put there.
        for row, cached in enumerate(num_cached):
            write_slots[row, :cached] = -1
        self.write_slots = write_slots.flatten()

    def fork(self, rows: Sequence[SampleKey], cases: Sequence[PromptCase]) -> None:
        """A sample after the first is a fork of its case's sequence: it shares every block."""
        by_id = {case.prompt_id: case for case in cases}
        prompt_lens = dict(zip(by_id, self.prompt_lens, strict=True))
        for prompt_id, sample in rows:
            if sample:
                self.allocator.fork(by_id[prompt_id].seq_id(0), by_id[prompt_id].seq_id(sample))
        self.seq_ids = [by_id[prompt_id].seq_id(sample) for prompt_id, sample in rows]
        self.prompt_lens = [prompt_lens[prompt_id] for prompt_id, _ in rows]
        self.read_slots = self._read_slots()

    def grow(self) -> None:
        """Every row's next token gets a slot; copy-on-writes are copied before it is written."""
        for seq_id in self.seq_ids:
            if not self.allocator.append(seq_id, 1):
                raise RuntimeError(f"pool too small: cannot grow sequence {seq_id}")
        self.memory.copy(self.allocator.take_copy_on_writes())
        self.read_slots = self._read_slots()
        self.write_slots = self.read_slots[:, -1]  # [rows]

    def _read_slots(self) -> torch.Tensor:
        """Every row's slots from the allocator's block tables, -1 at its pads (after the
        prompt): int64 [rows, width]."""
        rows = []
        for seq_id, prompt_len in zip(self.seq_ids, self.prompt_lens, strict=True):
            num_pads = self.prompt_width - prompt_len
            slots = slots_of(self.allocator.block_table(seq_id), 0,
                             self.allocator.num_tokens(seq_id), self.memory.block_size)  # fmt: skip
            rows.append(torch.cat([slots[:prompt_len], torch.full((num_pads,), -1),
                                   slots[prompt_len:]]))  # fmt: skip
        return torch.stack(rows)


class _PoolLayer(DynamicLayer):
    """One layer of ``PoolMemory`` in transformers' cache interface."""

    def __init__(self, owner: PoolMemory, layer: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer = layer
        self.num_tokens = 0  # the padded width written so far

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' K/V (``[rows, kv_heads, new, head_dim]``) through the slots and
        return every row's K/V so far, ``[rows, kv_heads, width, head_dim]``."""
        self.is_initialized = True
        num_rows, num_kv_heads, num_new, head_dim = key_states.shape
        owner = self.owner
        # [rows * new, kv_heads, head_dim]: token-major, as the slots are listed.
        flat = (num_rows * num_new, num_kv_heads, head_dim)
        new_keys = key_states.transpose(1, 2).reshape(flat)
        new_values = value_states.transpose(1, 2).reshape(flat)
        owner.memory.write(self.layer, new_keys, new_values, owner.write_slots)
        self.num_tokens += num_new
        return owner.memory.gather_padded(self.layer, owner.read_slots)

    def get_seq_length(self) -> int:
        """The padded width the cache holds (what the model takes as tokens before this one)."""
        return self.num_tokens


def padded_trajectories(
    model: Any,
    memory: StockMemory | PoolMemory,
    cases: Sequence[PromptCase],
    num_decode_steps: int,
    reference: dict[SampleKey, Trajectory] | None = None,
) -> dict[SampleKey, Trajectory]:
    """Every case's samples decoded together in one right-padded batch over ``memory``.

    Sample ``s`` of a case starts with the prompt's token ranked ``s``; with ``reference`` every
    sample is teacher-forced on the reference's tokens (``trajectories.paged_trajectories``).
    """
    width = max(len(case.token_ids) for case in cases)
    prompt_lens = torch.tensor([len(case.token_ids) for case in cases])  # [cases]
    input_ids = torch.full((len(cases), width), _PAD_ID)  # [cases, width]
    for row, case in enumerate(cases):
        input_ids[row, : len(case.token_ids)] = torch.tensor(case.token_ids)
    attention_mask = (torch.arange(width) < prompt_lens[:, None]).long()  # [cases, width]
    positions = torch.arange(width).expand(len(cases), width)  # [cases, width]
    memory.start(cases, num_decode_steps, width)
    prompt_logits = _forward(model, memory, input_ids, attention_mask, positions,
                             prompt_lens - 1)  # [cases, vocab]  # fmt: skip
    keys = [(case.prompt_id, sample) for case in cases for sample in range(case.num_samples)]
    case_rows = [row for row, case in enumerate(cases) for _ in range(case.num_samples)]
    memory.fork(keys, cases)
    attention_mask = attention_mask[case_rows]  # [samples, width]
    positions = prompt_lens[case_rows, None] - 1  # [samples, 1]
    logits = [[prompt_logits[row]] for row in case_rows]  # per sample, each [vocab]
    chosen = [
        [choose_token(prompt_logits[row], sample)]
        for (_, sample), row in zip(keys, case_rows, strict=True)
    ]
    for step in range(num_decode_steps):
        fed = [fed_token(reference, key, step, own) for key, own in zip(keys, chosen, strict=True)]
        memory.grow()
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(keys), 1)], 1)
        positions = positions + 1  # [samples, 1]
        step_logits = _forward(model, memory, torch.tensor(fed)[:, None], attention_mask,
                               positions, torch.zeros(len(keys), dtype=torch.int64))  # fmt: skip
        record_step(step_logits, logits, chosen)
    return as_trajectories(keys, logits, chosen)


def _forward(
    model: Any,
    memory: StockMemory | PoolMemory,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    last: torch.Tensor,
) -> torch.Tensor:
    """Each row's logits [rows, vocab] at its new token ``last`` (int64 [rows]); ``input_ids``,
    ``positions``: [rows, new]; ``attention_mask``: [rows, width so far]."""
    with torch.inference_mode():
        output = model(input_ids, attention_mask=attention_mask, position_ids=positions,
                       use_cache=True, **{cache_kwarg(model): memory.cache})  # fmt: skip
    return output.logits[torch.arange(len(last)), last]  # [rows, vocab]
