"""Paged and contiguous decode attention against a float64 reference, on every backend.

Without CUDA the Triton kernels run in Triton's CPU interpreter (switched on by tests/conftest.py).

Error bounds. fp32: max |out - ref| <= 1e-5 max |ref| (fp32 accumulation over a few hundred
tokens stays near 1e-7). fp16/bf16: per element |out - ref| <= u (max |V| + |ref|) + 1e-5 max |V|,
u the unit roundoff of the storage dtype: the kernel rounds the softmax probabilities to the
storage dtype for the PV product (error <= u sum p|v| / sum p <= u max |V|) and rounds the output
(<= u |ref|); the rest is fp32. u = 2^-11 for fp16; for bf16 2^-7, because the interpreter
truncates fp32 -> bf16 instead of rounding to nearest (2^-8 on a GPU).
"""

import pytest
import torch
from kvbench.kernels import (
    contiguous_decode_attention,
    materialize_batch,
    paged_decode_attention,
    reference_contiguous_decode,
    reference_paged_decode,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def scattered_tables(lens, block_size, num_spare_blocks, seed):
    """Block tables over a shuffled pool with spare blocks; rows padded past their need."""
    generator = torch.Generator().manual_seed(seed)
    needed = [-(-length // block_size) for length in lens]
    pool = torch.randperm(sum(needed) + num_spare_blocks, generator=generator).tolist()
    tables, start = [], 0
    for count in needed:
        tables.append(pool[start : start + count])
        start += count
    return tables


def make_batch(lens, block_size, dtype, num_q_heads=8, num_kv_heads=2, head_dim=32, seed=0):
    tables = scattered_tables(lens, block_size, num_spare_blocks=5, seed=seed)
    return materialize_batch(
        tables, lens, block_size, num_q_heads, num_kv_heads, head_dim, dtype, DEVICE, seed
    )


def paged(batch, backend, **kwargs):
    return paged_decode_attention(
        batch.query, batch.key_cache, batch.value_cache, batch.layout.block_tables,
        batch.layout.context_lens, backend=backend, **kwargs,
    )  # fmt: skip


def contiguous(batch, backend, **kwargs):
    return contiguous_decode_attention(
        batch.query, batch.key, batch.value, batch.layout.context_lens, backend=backend, **kwargs
    )


def assert_close_to_reference(out, batch):
    reference = reference_paged_decode(
        batch.query.cpu(), batch.key_cache.cpu(), batch.value_cache.cpu(),
        batch.layout.block_tables.cpu(), batch.layout.context_lens.cpu(),
    )  # fmt: skip
    error = (out.cpu().double() - reference).abs()  # [num_seqs, num_q_heads, head_dim]
    dtype = batch.query.dtype
    if dtype == torch.float32:
        assert error.max() <= 1e-5 * reference.abs().max()
        return
    value_scale = batch.value.abs().max().double().item()
    bound = UNIT_ROUNDOFF[dtype] * (value_scale + reference.abs()) + 1e-5 * value_scale
    assert (error <= bound).all(), f"max error {error.max():.3g}, bound {bound.min():.3g}"


@pytest.mark.parametrize("backend", ["triton", "torch", "sdpa"])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_matches_float64_reference(dtype, block_size, backend):
    # Ragged: a 1-token context, lengths off block boundaries, one spanning several tiles.
    batch = make_batch([1, 37, 150, 64], block_size, dtype, seed=block_size)
    assert_close_to_reference(paged(batch, backend), batch)


@pytest.mark.parametrize("backend", ["triton", "torch", "sdpa"])
def test_slots_past_the_context_are_never_read(backend):
    # A pool's unused slots may hold anything (torch.empty memory): NaN there must not leak.
    block_size = 16
    batch = make_batch([1, 37, 150, 64], block_size, torch.float32, seed=3)
    expected = paged(batch, backend)
    for row, length in enumerate(batch.layout.context_lens.tolist()):
        last_block = batch.layout.block_tables[row, (length - 1) // block_size].item()
        # The unused tail of each sequence's own last block (blocks are not shared here).
        batch.key_cache[last_block, (length - 1) % block_size + 1 :] = float("nan")
        batch.value_cache[last_block, (length - 1) % block_size + 1 :] = float("nan")
    out = paged(batch, backend)
    assert torch.isfinite(out).all()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("backend", ["triton", "torch", "sdpa"])
def test_contiguous_rows_past_the_context_are_never_read_nor_written(backend):
    batch = make_batch([5, 99, 130], 16, torch.float32)
    expected = contiguous(batch, backend)
    for row, length in enumerate(batch.layout.context_lens.tolist()):
        batch.key[row, length:] = float("nan")
        batch.value[row, length:] = float("nan")
    key, value = batch.key.clone(), batch.value.clone()
    assert torch.equal(contiguous(batch, backend), expected)
    # sdpa zeroes its copy's rows past each context, never the caller's.
    torch.testing.assert_close(batch.key, key, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(batch.value, value, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", ["triton", "torch", "sdpa"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contiguous_gives_bit_identical_output(dtype, backend):
    # Same algorithm, same plan (the same max_context_len: sdpa's one tile spans it): the layout
    # changes where K/V are read, never the result.
    batch = make_batch([5, 99, 130], 16, dtype)
    plan = {"max_context_len": 130}
    assert torch.equal(paged(batch, backend, **plan), contiguous(batch, backend, **plan))
    reference = reference_contiguous_decode(
        batch.query.cpu(), batch.key.cpu(), batch.value.cpu(), batch.layout.context_lens.cpu()
    )
    tolerance = 1e-5 if dtype == torch.float32 else 4 * UNIT_ROUNDOFF[dtype]
    error = (contiguous(batch, backend).cpu().double() - reference).abs().max()
    assert error <= tolerance * batch.value.abs().max().item()


def test_sdpa_groups_give_the_one_group_result(monkeypatch):
    # Groups of at most SDPA_GROUP_BYTES of K/V, each read to its own longest context.
    from kvbench.kernels import decode_torch

    batch = make_batch([3, 150, 40, 64, 1, 99], 16, torch.float32)
    whole = paged(batch, "sdpa")
    assert_close_to_reference(whole, batch)
    token_bytes = 2 * 2 * 32 * 4  # K and V, 2 KV heads of 32, fp32
    monkeypatch.setattr(decode_torch, "SDPA_GROUP_BYTES", 2 * 160 * token_bytes)
    monkeypatch.setattr(decode_torch, "SDPA_CALL_BYTES", 40 * token_bytes)
    lens = (3, 150, 40, 64, 1, 99)
    plan = decode_torch.length_groups(lens, token_bytes, 2 * 160 * token_bytes, 40 * token_bytes)
    assert len(plan) >= 3
    grouped = paged(batch, "sdpa", max_context_len=160)
    assert_close_to_reference(grouped, batch)
    assert (grouped - whole).abs().max() <= 1e-6 * whole.abs().max()
    assert torch.equal(grouped, contiguous(batch, "sdpa", max_context_len=160))


def _group_plan(lens, group_tokens=10_000, call_tokens=100):
    from kvbench.kernels.decode_torch import length_groups

    token_bytes = 1536  # SmolLM2's K and V of one token, fp32
    return length_groups(tuple(lens), token_bytes, group_tokens * token_bytes,
                         call_tokens * token_bytes)  # fmt: skip


def test_sdpa_groups_cover_every_sequence_once_at_its_longest_context():
    lens = [40, 7, 320, 41, 39, 300, 12, 600, 44]
    plan = _group_plan(lens, group_tokens=1_000)
    members = sorted(index for group, _ in plan for index in group)
    assert members == list(range(len(lens)))
    for group, group_len in plan:
        assert group_len == max(lens[index] for index in group)
        assert len(group) == 1 or len(group) * group_len <= 1_000


def test_sdpa_groups_keep_a_long_sequence_from_padding_short_ones():
    # 13 x 40 + 1 x 320 in one group read 14 x 320 tokens, 8x their context (3.6x the time).
    lens = [40] * 6 + [320] + [40] * 7
    plan = _group_plan(lens)
    assert sorted((len(group), group_len) for group, group_len in plan) == [(1, 320), (13, 40)]


def test_sdpa_groups_are_planned_by_length_not_by_position():
    # Alternating short and long contexts: in batch order every group would pad to the long one.
    lens = [10, 500] * 8
    plan = _group_plan(lens, group_tokens=4_000)
    assert {group_len for _, group_len in plan} == {10, 500}
    assert sum(len(group) * group_len for group, group_len in plan) == sum(lens)


def test_sdpa_groups_take_a_near_length_into_the_group():
    # Joining pads 8 x 4 tokens, far less than a call costs: one group.
    assert _group_plan([60] * 8 + [64]) == ((tuple(range(9)), 64),)


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim"),
    [(4, 1, 32), (4, 4, 16), (6, 2, 48)],
    ids=["mqa", "mha", "head-dim-48"],
)
def test_head_layouts(num_q_heads, num_kv_heads, head_dim):
    batch = make_batch([33, 70], 8, torch.float32, num_q_heads, num_kv_heads, head_dim)
    for backend in ("triton", "torch", "sdpa"):
        assert_close_to_reference(paged(batch, backend), batch)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_context_merges_to_the_same_result(dtype):
    # Four splits of 64 tokens over contexts of 40-250: some splits are empty.
    batch = make_batch([40, 250, 129], 16, dtype)
    plan = {"num_splits": 4, "max_context_len": batch.max_context_len}  # one plan for both
    split = paged(batch, "triton", **plan)
    assert_close_to_reference(split, batch)
    assert torch.equal(split, contiguous(batch, "triton", **plan))


def test_block_size_256_and_a_large_scale():
    batch = make_batch([300, 17], 256, torch.float32)
    for backend in ("triton", "torch", "sdpa"):
        out = paged(batch, backend, scale=0.5)
        reference = reference_paged_decode(
            batch.query, batch.key_cache, batch.value_cache, batch.layout.block_tables,
            batch.layout.context_lens, scale=0.5,
        )  # fmt: skip
        assert (out.double() - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_bad_inputs_raise_one_clear_error():
    batch = make_batch([10], 8, torch.float32)
    with pytest.raises(ValueError, match="block_tables: need int32"):
        paged_decode_attention(
            batch.query, batch.key_cache, batch.value_cache, batch.layout.block_tables.long(),
            batch.layout.context_lens,
        )  # fmt: skip
    with pytest.raises(ValueError, match="backend='cuda'"):
        paged(batch, "cuda")
    with pytest.raises(ValueError, match="heads"):
        contiguous_decode_attention(
            batch.query[:, :3], batch.key, batch.value, batch.layout.context_lens
        )


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 128])
def test_gpu_compiled_kernels_at_model_shape(dtype, block_size):
    # Llama-3-8B's heads (32 query, 8 KV, dim 128), contexts past one split and off blocks.
    batch = make_batch([1, 777, 2048, 4001], block_size, dtype, 32, 8, 128)
    # One planning bound for both layouts: the table's capacity (4,096 at block 128) would plan
    # other splits than the contiguous 4,001 on a GPU that wants several per sequence.
    plan = {"max_context_len": batch.max_context_len}
    out = paged(batch, "triton", **plan)
    assert_close_to_reference(out, batch)
    assert torch.equal(out, contiguous(batch, "triton", **plan))


def test_a_non_contiguous_query_and_table_give_the_contiguous_result():
    batch = make_batch([5, 40, 17], 8, torch.float32)
    # Same values, other strides: [num_seqs, heads, dim] and [num_seqs, blocks] as views.
    query = batch.query.transpose(0, 1).contiguous().transpose(0, 1)
    tables = batch.layout.block_tables.t().contiguous().t()
    assert not (query.is_contiguous() or tables.is_contiguous())
    out = paged_decode_attention(query, batch.key_cache, batch.value_cache, tables,
                                 batch.layout.context_lens, backend="triton")  # fmt: skip
    assert torch.equal(out, paged(batch, "triton"))
