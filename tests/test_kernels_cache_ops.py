"""KV write through a slot mapping, and block copies, on both backends (Triton interpreted on CPU).

Without CUDA, tests/conftest.py switches Triton to its CPU interpreter.
"""

import pytest
import torch
from kvbench.kernels import (
    contiguous_decode_attention,
    copy_blocks,
    paged_decode_attention,
    slot_mapping,
    write_kv,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pool(num_blocks, block_size, dtype, num_kv_heads=2, head_dim=16):
    """Zeroed key and value pools, each [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return (
        torch.zeros(shape, dtype=dtype, device=DEVICE),
        torch.zeros(shape, dtype=dtype, device=DEVICE),
    )


def tokens(num_tokens, dtype, seed=0, num_kv_heads=2, head_dim=16):
    """Random key and value rows, each [num_tokens, num_kv_heads, head_dim]."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_tokens, num_kv_heads, head_dim)
    key = torch.randn(shape, generator=generator).to(DEVICE, dtype)
    return key, torch.randn(shape, generator=generator).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_kv_puts_each_token_at_its_slot_and_skips_padding(dtype):
    key, value = tokens(5, dtype)
    slots = torch.tensor([3, 17, -1, 79, 40], device=DEVICE)
    written = {}
    for backend in ("triton", "torch"):
        key_cache, value_cache = pool(10, 8, dtype)
        write_kv(key, value, key_cache, value_cache, slots, backend=backend)
        written[backend] = (key_cache, value_cache)
        rows = key_cache.view(-1, 2, 16)  # [num_slots, num_kv_heads, head_dim]
        assert torch.equal(rows[17], key[1]) and torch.equal(value_cache[9, 7], value[3])
        assert rows.abs().sum(dim=(1, 2)).nonzero().flatten().tolist() == [3, 17, 40, 79]
    assert all(torch.equal(a, b) for a, b in zip(*written.values(), strict=True))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_slot_mapping_write_then_paged_read_equals_contiguous_read(backend):
    # A prefill of three sequences written through the slot mapping into scattered blocks...
    block_size, lens = 8, [13, 1, 30]
    tables = [[6, 2], [9], [0, 7, 3, 5]]
    generator = torch.Generator().manual_seed(1)
    key = torch.randn(3, 30, 2, 16, generator=generator).to(DEVICE)  # contiguous layout
    value = torch.randn(3, 30, 2, 16, generator=generator).to(DEVICE)
    valid = torch.arange(30)[None, :] < torch.tensor(lens)[:, None]  # [num_seqs, max_len]
    key_cache, value_cache = pool(10, block_size, torch.float32)
    slots = slot_mapping(tables, lens, block_size, device=DEVICE)
    write_kv(key[valid], value[valid], key_cache, value_cache, slots, backend=backend)
    # ...then a decode step reads it through the block tables: identical to the contiguous read.
    query = torch.randn(3, 4, 16, generator=generator).to(DEVICE)
    padded = torch.tensor([row + [0] * (4 - len(row)) for row in tables], dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    paged_out = paged_decode_attention(
        query, key_cache, value_cache, padded.to(DEVICE), context_lens, backend=backend,
        max_context_len=30,
    )  # fmt: skip
    contiguous_out = contiguous_decode_attention(query, key, value, context_lens, backend=backend)
    assert torch.equal(paged_out, contiguous_out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_blocks_copies_whole_blocks_of_key_and_value(dtype):
    key_cache, value_cache = pool(6, 16, dtype)
    generator = torch.Generator().manual_seed(2)
    key_cache.copy_(torch.randn(key_cache.shape, generator=generator).to(dtype))
    value_cache.copy_(torch.randn(value_cache.shape, generator=generator).to(dtype))
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    expected_key[[4, 0]] = key_cache[[1, 5]]
    expected_value[[4, 0]] = value_cache[[1, 5]]
    for backend in ("triton", "torch"):
        copied_key, copied_value = key_cache.clone(), value_cache.clone()
        copy_blocks(copied_key, copied_value, [(1, 4), (5, 0)], backend=backend)
        assert torch.equal(copied_key, expected_key) and torch.equal(copied_value, expected_value)


def test_copy_blocks_takes_an_allocators_copy_on_write_pairs():
    from kvbench.allocators import PagedAllocator
    from kvbench.core.request import Request

    allocator = PagedAllocator(num_slots=64, block_size=16, max_model_len=64)
    allocator.admit(0, Request(request_id=0, arrival_s=0.0, prompt_tokens=20, output_tokens=8), 20)
    allocator.fork(0, 1)
    allocator.append(1)  # the shared, partly filled last block is copied for sequence 1
    pairs = allocator.take_copy_on_writes()
    key_cache, value_cache = pool(4, 16, torch.float16)
    key_cache[pairs[0][0]] = 1.0
    copy_blocks(key_cache, value_cache, pairs, backend="triton")
    assert (key_cache[pairs[0][1]] == 1.0).all()


def test_copy_blocks_rejects_overlapping_pairs():
    key_cache, value_cache = pool(4, 8, torch.float32)
    with pytest.raises(ValueError, match="distinct and not sources"):
        copy_blocks(key_cache, value_cache, [(0, 1), (1, 2)])
    with pytest.raises(ValueError, match=r"block ids must be in \[0, 4\)"):
        copy_blocks(key_cache, value_cache, [(0, 9)])
