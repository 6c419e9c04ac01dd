"""Copy whole blocks of a pool: the copy-on-write pairs an allocator records on a shared write."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .decode_attention import BACKENDS, fp8_as_bytes


def _host_pairs(block_mapping: torch.Tensor | Sequence[tuple[int, int]]) -> list[list[int]]:
    """(src, dst) pairs as Python lists: checked on the host, so a list given on a GPU is never
    read back from the device (a tensor is: one sync)."""
    if isinstance(block_mapping, torch.Tensor):
        return block_mapping.reshape(-1, 2).tolist()
    return [[int(src), int(dst)] for src, dst in block_mapping]


def _check(key_cache: torch.Tensor, value_cache: torch.Tensor, pairs: list[list[int]]) -> None:
    if key_cache.shape != value_cache.shape or key_cache.dim() != 4:
        raise ValueError("key_cache and value_cache: equal [num_blocks, block_size, heads, dim]")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("key_cache and value_cache must be contiguous (blocks are copied whole)")
    sources = {src for src, _ in pairs}
    destinations = [dst for _, dst in pairs]
    num_blocks = key_cache.shape[0]
    if any(not 0 <= block < num_blocks for pair in pairs for block in pair):
        raise ValueError(f"block_mapping {pairs}: block ids must be in [0, {num_blocks})")
    # Copies run in parallel: a destination written twice, or read as a source, has no order.
    if len(set(destinations)) != len(destinations) or sources & set(destinations):
        raise ValueError(f"block_mapping {pairs}: destinations must be distinct and not sources")


def copy_blocks(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_mapping: torch.Tensor | Sequence[tuple[int, int]],
    backend: str = "triton",
) -> None:
    """For each (src, dst) pair, copy block ``src`` of both pools over block ``dst``, in place.

    Args:
        key_cache, value_cache: contiguous [num_blocks, block_size, num_kv_heads, head_dim].
        block_mapping: (src, dst) pairs (``Allocator.take_copy_on_writes()``), a list or an int
            tensor [num_pairs, 2]. Destinations must be distinct and never a source.
        backend: ``triton`` or ``torch``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: allowed are {', '.join(BACKENDS)}")
    pairs = _host_pairs(block_mapping)
    _check(key_cache, value_cache, pairs)
    # [num_pairs, 2] int64 on the pools' device
    mapping = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).to(key_cache.device)
    if backend == "triton":
        from .block_copy_triton import triton_copy_blocks  # triton imported lazily

        triton_copy_blocks(fp8_as_bytes(key_cache), fp8_as_bytes(value_cache), mapping)
        return
    key_cache[mapping[:, 1]] = key_cache[mapping[:, 0]]
    value_cache[mapping[:, 1]] = value_cache[mapping[:, 0]]
