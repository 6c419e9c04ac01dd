"""Write new tokens' K/V into a block pool through a slot mapping (vLLM's reshape_and_cache)."""

from __future__ import annotations

import torch

from .decode_attention import BACKENDS, fp8_as_bytes


def _check(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if key.dim() != 3 or key.shape != value.shape or key_cache.shape != value_cache.shape:
        raise ValueError(
            f"shapes: key {tuple(key.shape)}, value {tuple(value.shape)} must be equal "
            f"[num_tokens, num_kv_heads, head_dim]; caches {tuple(key_cache.shape)}, "
            f"{tuple(value_cache.shape)} equal [num_blocks, block_size, num_kv_heads, head_dim]"
        )
    if key_cache.dim() != 4 or key_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"cache rows {tuple(key_cache.shape[2:])} != token rows {key.shape[1:]}")
    num_tokens = key.shape[0]
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping: need int32/int64 [{num_tokens}], got {slot_mapping.dtype} "
            f"{tuple(slot_mapping.shape)}"
        )
    if key.dtype != key_cache.dtype or value.dtype != value_cache.dtype:
        raise ValueError(f"dtypes: tokens {key.dtype}/{value.dtype}, caches {key_cache.dtype}")
    for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache),
                         ("value_cache", value_cache)):  # fmt: skip
        # The kernel copies a token's heads as one row: they must be back to back.
        if tensor.stride(-1) != 1 or tensor.stride(-2) != tensor.shape[-1]:
            raise ValueError(f"{name}: the last two dims (heads, head_dim) must be contiguous")


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str = "triton",
) -> None:
    """Store each token's K/V at its pool slot, in place.

    Args:
        key, value: [num_tokens, num_kv_heads, head_dim].
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], same dtype.
        slot_mapping: int32/int64 [num_tokens]: token ``t`` goes to block
            ``slot // block_size``, row ``slot % block_size``; -1 skips the token (padding).
            Slots must be distinct.
        backend: ``triton`` or ``torch``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: allowed are {', '.join(BACKENDS)}")
    _check(key, value, key_cache, value_cache, slot_mapping)
    if backend == "triton":
        from .kv_write_triton import triton_write_kv  # triton imported lazily

        key, value, key_cache, value_cache = map(fp8_as_bytes, (key, value, key_cache, value_cache))
        triton_write_kv(key, value, key_cache, value_cache, slot_mapping)
        return
    kept = slot_mapping >= 0  # [num_tokens]
    slots = slot_mapping[kept].long()  # [num_kept]
    block_size = key_cache.shape[1]
    key_cache[slots // block_size, slots % block_size] = key[kept]
    value_cache[slots // block_size, slots % block_size] = value[kept]
