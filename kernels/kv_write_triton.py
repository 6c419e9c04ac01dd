"""Triton KV write: each token's K and V rows land in the pool slot the slot mapping names.

Imported only by ``write_kv``'s triton backend (triton is imported lazily).
"""

# The @triton.jit kernels take device pointers, strides and tl.constexpr parameters, unannotated
# as Triton's own kernels are (Triton reads parameter annotations to specialize a kernel).
# mypy: allow-untyped-defs, allow-incomplete-defs

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64
    stride_src_token,
    stride_cache_block,
    stride_cache_slot,
    ROW_ELEMS: tl.constexpr,
    PADDED_ROW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # -1 marks a padding token: nothing to write (as vLLM)
        elems = tl.arange(0, PADDED_ROW)  # [PADDED_ROW]: every head's row, back to back
        mask = elems < ROW_ELEMS
        src = token.to(tl.int64) * stride_src_token + elems
        dst = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_slot
        key = tl.load(key_ptr + src, mask=mask)  # [PADDED_ROW]
        value = tl.load(value_ptr + src, mask=mask)  # [PADDED_ROW]
        tl.store(key_cache_ptr + dst + elems, key, mask=mask)
        tl.store(value_cache_ptr + dst + elems, value, mask=mask)


def triton_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter key/value [num_tokens, num_kv_heads, head_dim] into the pools at ``slot_mapping``."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    row_elems = key.shape[1] * key.shape[2]
    _write_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key_cache.stride(0), key_cache.stride(1),
        ROW_ELEMS=row_elems,
        PADDED_ROW=triton.next_power_of_2(row_elems),
        BLOCK_SIZE=key_cache.shape[1],
    )  # fmt: skip
