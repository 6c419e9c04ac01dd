"""One batched forward pass of a causal LM over sequences whose K/V live in a ``KVMemory``.

``BatchRunner.forward`` takes each sequence's new tokens, their first position and the
allocator's table for the sequence, packs them into one row (decode tokens first, read by the
paged kernel; prefills after, by SDPA on their gathered K/V), runs the model once and returns the
logits of each sequence's last token. It knows nothing of schedulers: the engine-facing executor
(``real.RealExecutor``) and the batched logit-equivalence check both call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.core.catalog import hf_kv_shape
from kvbench.executors.attention import (
    ATTENTION_NAME,
    BatchLayout,
    Segment,
    register_batch_attention,
)
from kvbench.executors.kv_memory import KVMemory

DECODE_MODES = ("paged", "gather")


@dataclass(frozen=True)
class SeqInput:
    """One sequence's part of a forward.

    Attributes:
        token_ids: the tokens fed now (1 for a decode step).
        first_position: the position of ``token_ids[0]`` (tokens before it are in the pools).
        table: the allocator's block table of the sequence (slot ids for a contiguous one).
        num_unwritten: leading fed tokens whose K/V are in the pools already (a prefix-cache hit
            on the whole prompt still computes its last token, but must not write over a
            shared block).
    """

    token_ids: Sequence[int]
    first_position: int
    table: Sequence[int]
    num_unwritten: int = 0

    @property
    def context_len(self) -> int:
        """Tokens of the sequence once this forward has run."""
        return self.first_position + len(self.token_ids)


def model_kv_shape(model: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a transformers causal LM."""
    return hf_kv_shape(model.config)


class BatchRunner:
    """Batched forwards of ``model`` over ``memory``.

    Args:
        model: a transformers causal LM (Llama family), in eval mode.
        memory: the pools the allocator's tables index.
        decode_mode: ``paged`` (decode tokens through ``paged_decode_attention``) or ``gather``
            (every sequence through SDPA on its gathered K/V, the stock attention).
        backend: the paged kernel's backend (``torch`` on a CPU).
    """

    def __init__(
        self, model: Any, memory: KVMemory, decode_mode: str = "paged", backend: str = "torch"
    ) -> None:
        if decode_mode not in DECODE_MODES:
            raise ValueError(f"decode_mode={decode_mode!r}: allowed are {', '.join(DECODE_MODES)}")
        register_batch_attention()
        self.model = model
        self.memory = memory
        self.decode_mode = decode_mode
        self.backend = backend

    def forward(self, inputs: Sequence[SeqInput]) -> torch.Tensor:
        """Run every input's tokens in one forward; returns each input's last-token logits,
        [len(inputs), vocab], in the order given."""
        is_decode = [self.decode_mode == "paged" and len(seq.token_ids) == 1 for seq in inputs]
        order = [i for i, d in enumerate(is_decode) if d] + [
            i for i, d in enumerate(is_decode) if not d
        ]  # packed order: decode tokens first
        packed = [inputs[i] for i in order]
        num_decode = sum(is_decode)
        layout, last_token = self._layout(packed, num_decode)
        device = self.memory.device
        input_ids = torch.tensor([[t for seq in packed for t in seq.token_ids]],
                                 device=device)  # [1, N]  # fmt: skip
        positions = torch.cat([
            torch.arange(seq.first_position, seq.context_len) for seq in packed
        ])[None].to(device)  # [1, N]  # fmt: skip
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(ATTENTION_NAME)
        try:
            with torch.inference_mode():
                output = self.model(
                    input_ids, position_ids=positions, use_cache=False, kvbench_batch=layout,
                    logits_to_keep=last_token,
                )  # fmt: skip
        finally:
            self.model.set_attn_implementation(previous)
        packed_logits = output.logits[0]  # [num_seqs, vocab], packed order
        logits = torch.empty_like(packed_logits)
        logits[torch.tensor(order, device=packed_logits.device)] = packed_logits
        return logits

    def _layout(
        self, packed: Sequence[SeqInput], num_decode: int
    ) -> tuple[BatchLayout, torch.Tensor]:
        """The forward's ``BatchLayout`` and the packed index of each sequence's last token
        (int64 [num_seqs]), on the pools' device (built on the host, moved once each)."""
        block_size = self.memory.block_size
        device = self.memory.device
        slots = []  # per sequence int64 [new tokens]
        segments = []
        last_token = []
        start = 0
        for index, seq in enumerate(packed):
            context_slots = slots_of(seq.table, 0, seq.context_len, block_size)  # [context]
            new_slots = context_slots[seq.first_position :].clone()  # [new tokens]
            new_slots[: seq.num_unwritten] = -1
            slots.append(new_slots)
            if index >= num_decode:
                segments.append(Segment(start, len(seq.token_ids), context_slots.to(device)))
            start += len(seq.token_ids)
            last_token.append(start - 1)
        decode = packed[:num_decode]
        context_lens = [seq.context_len for seq in decode]
        max_blocks = max((-(-n // block_size) for n in context_lens), default=1)
        tables = torch.zeros((len(decode), max_blocks), dtype=torch.int32)  # [D, max_blocks]
        for row, seq in enumerate(decode):
            num_blocks = -(-seq.context_len // block_size)
            tables[row, :num_blocks] = torch.tensor(seq.table[:num_blocks], dtype=torch.int32)
        layout = BatchLayout(
            memory=self.memory,
            slots=torch.cat(slots).to(device),
            num_paged_decode=num_decode,
            decode_tables=tables.to(device),
            decode_context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),  # [D]
            max_decode_context=max(context_lens, default=1),
            segments=tuple(segments),
            backend=self.backend,
        )
        return layout, torch.tensor(last_token, device=device)


def slots_of(
    table: Sequence[int], first: int, end: int, block_size: int
) -> torch.Tensor:
    """Pool slots of positions ``first..end-1`` of a sequence with block table ``table``:
    int64 [end - first]."""
    positions = torch.arange(first, end)  # [end - first]
    blocks = torch.tensor(table[: -(-end // block_size)], dtype=torch.int64)  # [blocks used]
    return blocks[positions // block_size] * block_size + positions % block_size
