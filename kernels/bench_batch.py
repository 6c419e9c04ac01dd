"""A decode batch materialized twice: in a block pool (paged) and in per-sequence extents.

Both layouts hold the same logical K/V (random values), so paged and contiguous attention over a
``DecodeBatch`` must agree, and their timings differ only by the layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .kv_write import write_kv
from .layout import PagedLayout, slot_mapping, to_paged_layout

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class DecodeBatch:
    """One decode step's inputs in both layouts.

    Attributes:
        query: [num_seqs, num_q_heads, head_dim].
        key, value: [num_seqs, max_context_len, num_kv_heads, head_dim], the contiguous layout.
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], the paged pool.
        layout: block tables (into the pool) and context lengths.
        max_context_len: the longest context, the planning bound both kernels get.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    layout: PagedLayout
    max_context_len: int

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V one decode step reads: 2 x tokens x KV heads x head_dim x dtype."""
        num_tokens = int(self.layout.context_lens.sum())
        row_bytes = self.key.shape[2] * self.key.shape[3] * self.key.element_size()
        return 2 * num_tokens * row_bytes


def compact_block_ids(block_tables: Sequence[Sequence[int]]) -> tuple[list[list[int]], int]:
    """Renumber the blocks the tables use to 0..n-1, keeping their order in the pool.

    A replay's pool may hold a million blocks of which a batch reads a few thousand; ranking the
    used ids keeps every table's scatter (which blocks are neighbours, in which order) and drops
    the unused gaps. Returns the renumbered tables and the number of blocks.
    """
    used = sorted({block for table in block_tables for block in table})
    rank = {block: index for index, block in enumerate(used)}
    return [[rank[block] for block in table] for table in block_tables], len(used)


def scattered_block_tables(
    context_lens: Sequence[int], block_size: int, generator: torch.Generator
) -> list[list[int]]:
    """Block tables over a randomly permuted pool: no sequence gets two neighbouring blocks by
    design, the worst case for locality. Each sequence gets exactly the blocks it needs."""
    needed = [-(-length // block_size) for length in context_lens]
    order = torch.randperm(sum(needed), generator=generator).tolist()
    tables, start = [], 0
    for count in needed:
        tables.append(order[start : start + count])
        start += count
    return tables


def materialize_batch(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    block_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> DecodeBatch:
    """Random query and K/V for a batch, K/V written into both layouts.

    The block tables are compacted (``compact_block_ids``) into a pool of just the blocks they
    use; K/V values are standard normal, rounded to ``dtype``.
    """
    tables, num_blocks = compact_block_ids(block_tables)
    layout = to_paged_layout(tables, context_lens, block_size, device)
    num_seqs, max_len = len(context_lens), max(context_lens)
    # Drawn on the device itself: a GPU batch holds gigabytes that a CPU generator would be slow
    # to fill (the same seed gives other values on another device type).
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (num_seqs, max_len, num_kv_heads, head_dim)

    def random(size: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(size, generator=generator, device=device).to(dtype)

    query = random((num_seqs, num_q_heads, head_dim))  # [num_seqs, num_q_heads, head_dim]
    key, value = random(shape), random(shape)  # [num_seqs, max_len, num_kv_heads, head_dim]
    pool_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.zeros(pool_shape, dtype=dtype, device=device)
    value_cache = torch.zeros(pool_shape, dtype=dtype, device=device)
    slots = slot_mapping(tables, context_lens, block_size, device=device)  # [total tokens]
    # Token t of sequence s is key[s, t]; the slot mapping lists tokens in that order.
    valid = torch.arange(max_len, device=device)[None, :] < layout.context_lens[:, None].long()
    write_kv(key[valid], value[valid], key_cache, value_cache, slots, backend="torch")
    return DecodeBatch(query, key, value, key_cache, value_cache, layout, max_len)


def virtual_spans(batch: DecodeBatch, span_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's K/V in vAttention's layout: each sequence at the start of its own span of
    ``span_tokens`` tokens (the model's maximum length) in one tensor of spans, read through a
    view of the first ``max_context_len`` tokens of each span.

    Returns (key, value), each [num_seqs, max_context_len, num_kv_heads, head_dim], contiguous
    within a sequence and ``span_tokens`` rows apart between sequences: what the contiguous
    kernel reads under vAttention (on a GPU only the mapped pages of a span are physical memory).
    """
    num_seqs, max_len, num_kv_heads, head_dim = batch.key.shape
    if span_tokens < max_len:
        raise ValueError(f"span_tokens={span_tokens}: shorter than the batch's {max_len} tokens")
    shape = (num_seqs, span_tokens, num_kv_heads, head_dim)  # [num_seqs, span, heads, head_dim]
    key_spans = torch.zeros(shape, dtype=batch.key.dtype, device=batch.key.device)
    value_spans = torch.zeros_like(key_spans)
    key_spans[:, :max_len] = batch.key
    value_spans[:, :max_len] = batch.value
    return key_spans[:, :max_len], value_spans[:, :max_len]
