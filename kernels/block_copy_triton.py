"""Triton block copy: copy-on-write pairs, each a whole block of K and of V.

Imported only by ``copy_blocks``'s triton backend (triton is imported lazily).
"""

# The @triton.jit kernels take device pointers, strides and tl.constexpr parameters, unannotated
# as Triton's own kernels are (Triton reads parameter annotations to specialize a kernel).
# mypy: allow-untyped-defs, allow-incomplete-defs

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements one program copies: a block of 16 tokens x 8 heads x 128 dims is 16 Ki elements, so a
# few programs per block keep many blocks in flight.
CHUNK_ELEMS = 4096


@triton.jit
def _copy_blocks_kernel(
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache_ptr,  # same shape
    block_mapping_ptr,  # [num_pairs, 2] int64: (src, dst)
    BLOCK_ELEMS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    elems = chunk * CHUNK + tl.arange(0, CHUNK)  # [CHUNK]
    mask = elems < BLOCK_ELEMS
    key = tl.load(key_cache_ptr + src * BLOCK_ELEMS + elems, mask=mask)  # [CHUNK]
    value = tl.load(value_cache_ptr + src * BLOCK_ELEMS + elems, mask=mask)  # [CHUNK]
    tl.store(key_cache_ptr + dst * BLOCK_ELEMS + elems, key, mask=mask)
    tl.store(value_cache_ptr + dst * BLOCK_ELEMS + elems, value, mask=mask)


def triton_copy_blocks(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor
) -> None:
    """Copy block ``src`` to ``dst`` for every row of block_mapping [num_pairs, 2] (int64)."""
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    block_elems = key_cache[0].numel()
    chunk = min(CHUNK_ELEMS, triton.next_power_of_2(block_elems))
    grid = (num_pairs, triton.cdiv(block_elems, chunk))
    _copy_blocks_kernel[grid](
        key_cache, value_cache, block_mapping, BLOCK_ELEMS=block_elems, CHUNK=chunk
    )
