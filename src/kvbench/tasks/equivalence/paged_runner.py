"""Run a model's forwards with its K/V in a kvbench allocator's block pool.

The allocator (``paged`` or ``paged_prefix``) decides where every token's K/V go; this class
turns its block tables into the slot mappings and tables of the attention function
(``attention.py``) and performs the copy-on-writes it records.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvbench.allocators import make_allocator
from kvbench.core.catalog import hf_kv_shape
from kvbench.core.request import Request
from kvbench.executors.kv_memory import KVMemory
from kvbench.kernels import slot_mapping
from kvbench.tasks.equivalence.attention import ATTENTION_NAME, PagedStep, register_paged_attention


class PagedRunner:
    """Sequences of one model over one allocator and its per-layer pools.

    Args:
        model: a transformers causal LM (Llama family).
        allocator_name: ``paged`` or ``paged_prefix``.
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        mode: ``paged`` (paged decode kernel) or ``gather`` (gather-into-contiguous + SDPA).
        backend: the paged kernel's backend.
        kv_dtype: the pools' storage dtype (None: the model's; ``torch.float8_e4m3fn``: fp8 K/V).
        calibrate_scales: fp8 scales per layer from the first forward (``KVMemory``); False: 1.0.
    """

    def __init__(
        self,
        model: Any,
        allocator_name: str,
        num_blocks: int,
        block_size: int,
        mode: str = "paged",
        backend: str = "torch",
        kv_dtype: torch.dtype | None = None,
        calibrate_scales: bool = False,
    ) -> None:
        register_paged_attention()
        config = model.config
        num_layers, num_kv_heads, head_dim = hf_kv_shape(config)
        self.model = model
        self.mode = mode
        self.backend = backend
        self.block_size = block_size
        self.allocator = make_allocator(
            allocator_name, num_blocks * block_size, block_size, config.max_position_embeddings
        )
        self.pool = KVMemory(num_layers, num_kv_heads, head_dim, num_blocks * block_size,
                             block_size, model.dtype, kv_dtype=kv_dtype,
                             calibrate_scales=calibrate_scales)  # fmt: skip

    def prefill(self, seq_id: int, request: Request, prompt_ids: list[int]) -> torch.Tensor:
        """Admit a sequence and run its prompt; returns the last position's logits [vocab].

        With ``paged_prefix``, prompt blocks already in the pool are not computed again: only
        the rest of the prompt runs, attending to the cached K/V (at least the last token runs,
        as in vLLM, but its K/V are not written over a shared block).
        """
        num_tokens = len(prompt_ids)
        if not self.allocator.admit(seq_id, request, num_tokens):
            raise RuntimeError(f"pool too small: cannot admit sequence {seq_id}")
        # Only paged_prefix finds blocks already in the pool; plain paged computes every token.
        prefix_cache = self.allocator.prefix_cache
        num_cached = prefix_cache.cached_prefix_tokens(seq_id) if prefix_cache is not None else 0
        first = min(num_cached, num_tokens - 1)
        slots = self._slots(seq_id, num_tokens, num_tokens - first)  # [num_tokens - first]
        slots[: max(num_cached - first, 0)] = -1  # those K/V are in the pool already
        return self._forward(seq_id, prompt_ids[first:], first, slots)

    def fork(self, parent_id: int, child_id: int) -> None:
        """A new sequence sharing all of the parent's blocks (a second sample of one prompt)."""
        self.allocator.fork(parent_id, child_id)

    def decode(self, seq_id: int, token: int) -> torch.Tensor:
        """Append ``token`` to the sequence and run it; returns its logits [vocab]."""
        if not self.allocator.append(seq_id, 1):
            raise RuntimeError(f"pool too small: cannot grow sequence {seq_id}")
        # A write into a shared partial block was redirected to a copy: fill it before writing.
        self.pool.copy(self.allocator.take_copy_on_writes())
        num_tokens = self.allocator.num_tokens(seq_id)
        return self._forward(seq_id, [token], num_tokens - 1, self._slots(seq_id, num_tokens, 1))

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks (``paged_prefix`` keeps hashed ones cached)."""
        self.allocator.free(seq_id)

    def _slots(self, seq_id: int, num_tokens: int, num_new: int) -> torch.Tensor:
        table = self.allocator.block_table(seq_id)
        return slot_mapping([table], [num_tokens], self.block_size, [num_new])  # [num_new]

    def _forward(
        self, seq_id: int, token_ids: list[int], first_position: int, slots: torch.Tensor
    ) -> torch.Tensor:
        num_tokens = first_position + len(token_ids)
        table = self.allocator.block_table(seq_id)
        step = PagedStep(
            pool=self.pool,
            block_table=torch.tensor([table], dtype=torch.int32),  # [1, num_blocks_of_seq]
            context_len=num_tokens,
            slots=slots,
            mode=self.mode,
            backend=self.backend,
        )
        input_ids = torch.tensor([token_ids])  # [1, num_new]
        positions = torch.arange(first_position, num_tokens)[None]  # [1, num_new]
        with _attention_implementation(self.model, ATTENTION_NAME), torch.inference_mode():
            output = self.model(
                input_ids, position_ids=positions, use_cache=False, kvbench_paged=step
            )
        return output.logits[0, -1]  # [vocab]


@contextmanager
def _attention_implementation(model: Any, name: str) -> Iterator[None]:
    """The model runs with attention ``name`` inside the block, with its own again after it."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
