"""Decode attention over a paged KV cache and over the naive allocator's contiguous one.

``paged_decode_attention`` reads K/V through a block table (vLLM's layout);
``contiguous_decode_attention`` reads per-sequence extents (the naive allocators' layout). Both run
the same algorithm — the same tiles, splits and online softmax — so timing one against the other
measures the block-table indirection alone. Each has a Triton backend (GPU, or the CPU
interpreter under ``TRITON_INTERPRET=1``), a torch backend (the same tiled algorithm, any device)
and an ``sdpa`` backend (each group of sequences' contexts gathered at once into torch's fused
attention: the real executor's CPU path).
"""

from __future__ import annotations

import math

import torch

from .decode_torch import (
    TileLoader,
    contiguous_tile_loader,
    paged_tile_loader,
    sdpa_decode,
    torch_decode,
)
from .tiling import plan_splits

# Backends of every kernel (decode, K/V writes, block copies).
BACKENDS = ("triton", "torch")
# The decode kernels' also: ``sdpa``, torch's fused attention over the gathered context.
DECODE_BACKENDS = (*BACKENDS, "sdpa")
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# fp8 K/V (e4m3, vLLM's kv_cache_dtype=fp8): stored in one byte, dequantized on load, times the
# per-tensor scales k_scale/v_scale, to the query's dtype.
FP8_KV_DTYPE = torch.float8_e4m3fn
# Triton types e4m3 as fp8e4nv, which it compiles for NVIDIA GPUs of compute capability 8.9 or
# later only (Ada, Hopper, Blackwell: triton/backends/nvidia/compiler.py adds it from sm_89).
FP8_MIN_CAPABILITY = (8, 9)


def triton_fp8_problem(device: torch.device) -> str | None:
    """Why the Triton decode kernel cannot read fp8 K/V on ``device`` (None: it can). The CPU
    interpreter converts e4m3 in software."""
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability >= FP8_MIN_CAPABILITY:
        return None
    name = torch.cuda.get_device_name(device)
    return (f"Triton reads fp8 (e4m3) K/V on GPUs of compute capability "
            f"{'.'.join(map(str, FP8_MIN_CAPABILITY))} or later, and {name} is "
            f"{'.'.join(map(str, capability))}")  # fmt: skip


def fp8_as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as the cache kernels move it: fp8 viewed as uint8 (the same bytes; a Triton
    pointer to fp8e4nv compiles on compute capability 8.9 or later only), any other dtype as is."""
    return tensor.view(torch.uint8) if tensor.dtype == FP8_KV_DTYPE else tensor


def _check_common(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, backend: str
) -> None:
    if backend not in DECODE_BACKENDS:
        raise ValueError(f"backend={backend!r}: allowed are {', '.join(DECODE_BACKENDS)}")
    if query.dim() != 3 or key.dim() != 4 or key.shape != value.shape:
        raise ValueError(
            f"shapes: query {tuple(query.shape)} must be [num_seqs, num_q_heads, head_dim], "
            f"key {tuple(key.shape)} and value {tuple(value.shape)} equal 4-d"
        )
    kv_ok = key.dtype == value.dtype and key.dtype in (query.dtype, FP8_KV_DTYPE)
    if not kv_ok or query.dtype not in STORAGE_DTYPES:
        raise ValueError(
            f"dtypes: query {query.dtype}, key {key.dtype}, value {value.dtype}: must be one of "
            f"{', '.join(map(str, STORAGE_DTYPES))}, all the same (or K/V in {FP8_KV_DTYPE})"
        )
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key.shape[2]
    if key.shape[3] != head_dim or num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"heads: {num_q_heads} query heads of dim {head_dim} need a KV head count that "
            f"divides them and the same dim; got {num_kv_heads} of dim {key.shape[3]}"
        )
    if key.stride() != value.stride() or key.stride(-1) != 1:
        raise ValueError("key and value must have equal strides and a contiguous head_dim")
    if backend == "triton" and key.dtype == FP8_KV_DTYPE:
        problem = triton_fp8_problem(key.device)
        if problem:
            raise ValueError(f"{problem}: use backend torch or sdpa there")


def _check_int32(name: str, tensor: torch.Tensor, dims: int, num_seqs: int) -> None:
    if tensor.dtype != torch.int32 or tensor.dim() != dims or tensor.shape[0] != num_seqs:
        raise ValueError(
            f"{name}: need int32 with {dims} dim(s) and {num_seqs} rows, got {tensor.dtype} "
            f"{tuple(tensor.shape)}"
        )


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    backend: str = "triton",
    *,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """One decode step of attention, reading K/V through per-sequence block tables.

    Args:
        query: [num_seqs, num_q_heads, head_dim], the new token of each sequence.
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], fp32, fp16 or
            bf16 (as the query); ``block_size`` a power of two. GQA/MQA: num_kv_heads divides
            num_q_heads, query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)``.
        block_tables: int32 [num_seqs, max_blocks_per_seq]; row ``i`` lists sequence ``i``'s
            physical blocks in order. Entries past its last block are never read for attention
            but must be valid block ids (pad with 0).
        context_lens: int32 [num_seqs], each in ``[1, max_blocks_per_seq * block_size]``.
        scale: softmax scale, default ``1 / sqrt(head_dim)``.
        backend: ``triton``, ``torch`` or ``sdpa``.
        max_context_len: bound on ``context_lens`` used to plan the work (default: the block
            table's capacity); pass the same value to ``contiguous_decode_attention`` for an
            identical plan.
        num_splits: programs per (sequence, KV head) along the context (default: enough to fill
            the device).
        k_scale, v_scale: per-tensor scales of fp8 K/V (``FP8_KV_DTYPE``): a stored element
            ``e`` means ``e x scale``, dequantized on load to the query's dtype (vLLM's fp8 KV
            cache); ignored for K/V in the query's dtype.

    Returns:
        [num_seqs, num_q_heads, head_dim] in the query's dtype; accumulation is fp32.
    """
    _check_common(query, key_cache, value_cache, backend)
    num_seqs = query.shape[0]
    _check_int32("block_tables", block_tables, 2, num_seqs)
    _check_int32("context_lens", context_lens, 1, num_seqs)
    block_size = key_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size}: must be a power of two")
    bound = max_context_len or block_tables.shape[1] * block_size
    scale = _scale(scale, query.shape[2])
    if backend == "torch":
        loader = paged_tile_loader(key_cache, value_cache, block_tables)
        return torch_decode(query, context_lens, loader, bound, scale, kv_scales=(k_scale, v_scale))
    if backend == "sdpa":
        return sdpa_decode(query, context_lens,
                           lambda seqs: paged_tile_loader(key_cache, value_cache,
                                                          block_tables[seqs]),
                           key_cache.shape[2], bound, scale,
                           kv_scales=(k_scale, v_scale))  # fmt: skip
    from .decode_triton import num_programs_wanted, triton_decode  # triton imported lazily

    plan = plan_splits(
        num_seqs, key_cache.shape[2], bound, num_programs_wanted(query.device), num_splits
    )
    return triton_decode(query, key_cache, value_cache, block_tables, context_lens, scale, plan,
                         kv_scales=(k_scale, v_scale))  # fmt: skip


def contiguous_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    backend: str = "triton",
    *,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """One decode step of attention over per-sequence contiguous K/V (the naive layout).

    Args:
        query: [num_seqs, num_q_heads, head_dim].
        key, value: [num_seqs, max_len, num_kv_heads, head_dim]: sequence ``i``'s tokens are
            ``key[i, :context_lens[i]]``.
        context_lens: int32 [num_seqs], each in ``[1, max_len]``.
        scale, backend, num_splits, k_scale, v_scale: as ``paged_decode_attention``.
        max_context_len: bound on ``context_lens`` (default ``max_len``).

    Returns:
        [num_seqs, num_q_heads, head_dim] in the query's dtype.
    """
    _check_common(query, key, value, backend)
    num_seqs = query.shape[0]
    if key.shape[0] != num_seqs:
        raise ValueError(f"key has {key.shape[0]} sequences, query {num_seqs}")
    _check_int32("context_lens", context_lens, 1, num_seqs)
    bound = max_context_len or key.shape[1]
    scale = _scale(scale, query.shape[2])
    if backend == "torch":
        return torch_decode(query, context_lens, contiguous_tile_loader(key, value), bound, scale,
                            kv_scales=(k_scale, v_scale))  # fmt: skip
    if backend == "sdpa":

        load = contiguous_tile_loader(key, value)

        def copies_for(seqs: torch.Tensor) -> TileLoader:
            def load_copy(tile_start: int, tile_end: int) -> tuple[torch.Tensor, torch.Tensor]:
                key_tile, value_tile = load(tile_start, tile_end)
                return key_tile[seqs], value_tile[seqs]  # indexing copies: sdpa writes its tile

            return load_copy

        return sdpa_decode(query, context_lens, copies_for, key.shape[2], bound, scale,
                           kv_scales=(k_scale, v_scale))  # fmt: skip
    from .decode_triton import num_programs_wanted, triton_decode  # triton imported lazily

    plan = plan_splits(num_seqs, key.shape[2], bound, num_programs_wanted(query.device), num_splits)
    return triton_decode(query, key, value, None, context_lens, scale, plan,
                         kv_scales=(k_scale, v_scale))  # fmt: skip
