"""Benchmark block tables dealt from a replay's real ones.

A replay snapshot holds many short sequences whose blocks lie where the allocator put them; a
benchmark wants ``batch_size`` sequences of a chosen context length. Dealing walks the snapshot's
blocks in block-table order (each sequence's blocks in logical order, sequence after sequence)
and hands each benchmark sequence the next ``ceil(context_len / block_size)`` of them, so every
benchmark table is made of runs of real tables: the allocator's scatter, at any length.
"""

from __future__ import annotations

from collections.abc import Sequence


def block_stream(block_tables: Sequence[Sequence[int]]) -> list[int]:
    """The tables' blocks, table after table, each block once (at its first appearance).

    A block shared by several tables (a fork, a cached prefix) is kept once, so no two dealt
    sequences read the same physical block (which would flatter the paged kernel's caches).
    """
    seen: set[int] = set()
    stream: list[int] = []
    for table in block_tables:
        for block in table:
            if block not in seen:
                seen.add(block)
                stream.append(block)
    return stream


def deal_block_tables(
    stream: Sequence[int], context_len: int, block_size: int, batch_size: int
) -> list[list[int]]:
    """Up to ``batch_size`` tables of ``ceil(context_len / block_size)`` consecutive stream blocks.

    Fewer tables when the stream runs out (the caller records the batch it really got); none if
    even one sequence does not fit.
    """
    blocks_per_seq = -(-context_len // block_size)
    num_seqs = min(batch_size, len(stream) // blocks_per_seq)
    return [
        list(stream[seq * blocks_per_seq : (seq + 1) * blocks_per_seq]) for seq in range(num_seqs)
    ]
