"""Engine block tables -> the tensors the kernels read: padded block table, context lengths, slots.

The engine speaks Python (``allocator.block_table(seq)`` is a tuple of physical block ids); the
kernels want rectangular int32 tensors. Nothing here imports the engine: an allocator is anything
with ``block_size``, ``block_table(seq_id)`` and ``num_tokens(seq_id)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class BlockTableSource(Protocol):
    """The part of kvbench's Allocator protocol the layout needs."""

    block_size: int

    def block_table(self, seq_id: int) -> tuple[int, ...]: ...

    def num_tokens(self, seq_id: int) -> int: ...


@dataclass(frozen=True)
class PagedLayout:
    """A batch's paged KV layout as kernel inputs.

    Attributes:
        block_tables: int32 [num_seqs, max_blocks_per_seq], rows padded with block 0.
        context_lens: int32 [num_seqs], tokens of each sequence.
        block_size: tokens per block.
    """

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    block_size: int

    @property
    def num_seqs(self) -> int:
        """Sequences in the batch."""
        return self.context_lens.shape[0]


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def _check_tables(
    block_tables: Sequence[Sequence[int]], context_lens: Sequence[int], block_size: int
) -> None:
    if len(block_tables) != len(context_lens):
        raise ValueError(f"{len(block_tables)} block tables for {len(context_lens)} lengths")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size}: must be a power of two")
    for seq, (table, length) in enumerate(zip(block_tables, context_lens, strict=True)):
        if length < 1 or len(table) < _blocks_for(length, block_size):
            raise ValueError(
                f"sequence {seq}: {length} tokens need {_blocks_for(length, block_size)} blocks "
                f"of {block_size} (and >= 1 token); its table has {len(table)}"
            )
        if any(block < 0 for block in table):
            raise ValueError(f"sequence {seq}: negative block id in {list(table)}")


def to_paged_layout(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> PagedLayout:
    """Pad per-sequence block tables into one int32 tensor (ValueError if a table is too short).

    Each table keeps only the blocks its context needs (``ceil(len / block_size)``); the rest of
    the row is block 0, which the kernels never read for attention.
    """
    _check_tables(block_tables, context_lens, block_size)
    used = [
        list(table[: _blocks_for(length, block_size)])
        for table, length in zip(block_tables, context_lens, strict=True)
    ]
    width = max((len(table) for table in used), default=0)
    padded = [table + [0] * (width - len(table)) for table in used]
    return PagedLayout(
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).view(len(used), width),
        context_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
        block_size=block_size,
    )


def layout_from_allocator(
    allocator: BlockTableSource, seq_ids: Sequence[int], device: torch.device | str = "cpu"
) -> PagedLayout:
    """The paged layout of ``seq_ids`` as ``allocator`` holds them now (tokens = its count)."""
    tables = [allocator.block_table(seq_id) for seq_id in seq_ids]
    lengths = [allocator.num_tokens(seq_id) for seq_id in seq_ids]
    return to_paged_layout(tables, lengths, allocator.block_size, device)


def slot_mapping(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    block_size: int,
    num_new_tokens: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Pool slots (``block * block_size + offset``) of each sequence's newest tokens.

    Sequence ``i`` contributes its last ``num_new_tokens[i]`` tokens (default: all of them, a
    prefill; 1 each for a decode step), in order; returns int64 [sum of new tokens], the input of
    ``write_kv``.
    """
    _check_tables(block_tables, context_lens, block_size)
    counts = list(context_lens) if num_new_tokens is None else list(num_new_tokens)
    slots: list[torch.Tensor] = []
    for table, length, count in zip(block_tables, context_lens, counts, strict=True):
        if not 0 <= count <= length:
            raise ValueError(f"num_new_tokens={count}: must be in [0, {length}]")
        blocks = torch.tensor(list(table), dtype=torch.int64)  # [num_blocks of the sequence]
        positions = torch.arange(length - count, length)  # [count]
        slots.append(blocks[positions // block_size] * block_size + positions % block_size)
    if not slots:
        return torch.zeros(0, dtype=torch.int64, device=device)
    return torch.cat(slots).to(device)
