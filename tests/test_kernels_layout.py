"""Engine block tables -> kernel tensors: padded tables, slot mapping, CSR, dealing, split plans;
and attention over the block tables a real allocator holds in the middle of a replay.

Without CUDA, tests/conftest.py switches Triton to its CPU interpreter.
"""

import itertools

import pytest
import torch
from kvbench.kernels import (
    TILE_TOKENS,
    block_stream,
    deal_block_tables,
    layout_from_allocator,
    materialize_batch,
    paged_decode_attention,
    plan_splits,
    reference_paged_decode,
    slot_mapping,
    to_csr_page_table,
    to_paged_layout,
)

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_paged_layout_pads_with_block_zero_and_keeps_only_needed_blocks():
    layout = to_paged_layout([[7, 3, 9], [4]], [17, 5], block_size=8)
    assert layout.block_tables.dtype == layout.context_lens.dtype == torch.int32
    assert layout.block_tables.tolist() == [[7, 3, 9], [4, 0, 0]]
    # 9 tokens need 2 blocks of 8: the third entry is dropped.
    assert to_paged_layout([[7, 3, 9]], [9], 8).block_tables.tolist() == [[7, 3]]


def test_paged_layout_rejects_a_table_too_short_for_its_tokens():
    with pytest.raises(ValueError, match="sequence 1: 20 tokens need 3 blocks of 8"):
        to_paged_layout([[1], [2, 3]], [3, 20], block_size=8)


def test_slot_mapping_of_a_prefill_and_of_a_decode_step():
    tables, lens = [[5, 2], [7]], [10, 3]
    prefill = slot_mapping(tables, lens, block_size=8)
    assert prefill.tolist() == [40, 41, 42, 43, 44, 45, 46, 47, 16, 17, 56, 57, 58]
    decode = slot_mapping(tables, lens, block_size=8, num_new_tokens=[1, 1])
    assert decode.tolist() == [17, 58]


def test_csr_page_table_matches_flashinfer_conventions():
    csr = to_csr_page_table([[5, 2, 11], [7], [3, 4]], [17, 8, 9], block_size=8)
    assert csr.kv_indptr.tolist() == [0, 3, 4, 6]
    assert csr.kv_indices.tolist() == [5, 2, 11, 7, 3, 4]
    assert csr.kv_last_page_len.tolist() == [1, 8, 1]
    assert csr.context_lens().tolist() == [17, 8, 9]
    for tensor in (csr.kv_indptr, csr.kv_indices, csr.kv_last_page_len):
        assert tensor.dtype == torch.int32


def test_dealing_keeps_each_block_once_and_runs_of_real_tables():
    stream = block_stream([(4, 9, 1), (7, 9), (2,)])
    assert stream == [4, 9, 1, 7, 2]  # the shared block 9 once
    assert deal_block_tables(stream, context_len=20, block_size=8, batch_size=3) == [
        [4, 9, 1]
    ]  # 20 tokens need 3 blocks: one sequence fits in 5 blocks
    assert deal_block_tables(stream, 16, 8, 2) == [[4, 9], [1, 7]]


@pytest.mark.parametrize(
    ("num_seqs", "max_context_len", "wanted", "expected_splits"),
    [(1, 4096, 264, 16), (64, 4096, 264, 1), (4, 4096, 264, 9), (1, 100, 264, 1)],
)
def test_split_plan_fills_the_device_without_tiny_splits(
    num_seqs, max_context_len, wanted, expected_splits
):
    plan = plan_splits(num_seqs, 8, max_context_len, wanted)
    assert plan.num_splits == expected_splits
    assert plan.split_tokens % TILE_TOKENS == 0
    assert plan.num_splits * plan.split_tokens >= max_context_len


def _scattered_allocator():
    """A paged allocator whose tables are scattered: admit, free every other one, admit more."""
    allocator = make_allocator("paged", num_slots=30 * 16, block_size=16, max_model_len=1024)
    for seq in range(8):
        request = Request(request_id=seq, arrival_s=0.0, prompt_tokens=40, output_tokens=10)
        allocator.admit(seq, request, 40)
    for seq in range(0, 8, 2):
        allocator.free(seq)
    for seq in range(8, 11):
        request = Request(request_id=seq, arrival_s=0.0, prompt_tokens=90, output_tokens=10)
        allocator.admit(seq, request, 90)
    return allocator, [1, 3, 8, 9, 10]


def test_layout_from_an_allocator_after_frees():
    allocator, seq_ids = _scattered_allocator()
    layout = layout_from_allocator(allocator, seq_ids)
    assert layout.context_lens.tolist() == [40, 40, 90, 90, 90]
    tables = [allocator.block_table(seq) for seq in seq_ids]
    assert layout.block_tables[3, :6].tolist() == list(tables[3])
    # Once the fresh blocks ran out, freed ones were reused: not one contiguous run.
    assert any(b != a + 1 for a, b in itertools.pairwise(tables[3]))


def test_attention_over_block_tables_taken_mid_replay():
    # 1 GiB of OPT-13B KV: 1,310 slots, so 40 requests queue, finish and reuse freed blocks.
    deployment = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=1)
    requests = [
        Request(request_id=i, arrival_s=0.002 * i, prompt_tokens=20 + 37 * i % 90,
                output_tokens=5 + 29 * i % 60)
        for i in range(40)
    ]  # fmt: skip
    snapshots, num_steps = [], []

    def on_step(batch, allocator):
        num_steps.append(1)
        if len(num_steps) == 60:  # mid-run, with 12-odd sequences decoding
            # Copy now: the allocator moves on after this iteration.
            seq_ids = [seq.seq_id for seq in batch.decode]
            tables = [allocator.block_table(seq) for seq in seq_ids]
            snapshots.append((tables, [allocator.num_tokens(seq) for seq in seq_ids]))

    allocator = make_allocator("paged", deployment.num_kv_slots, 16, 2048)
    simulate(requests, Scheduler(SchedulerLimits(max_model_len=2048)), allocator,
             RooflineCostModel(deployment), on_step=on_step)  # fmt: skip
    (tables, lens), = snapshots
    assert any(b != a + 1 for table in tables for a, b in itertools.pairwise(table))
    batch = materialize_batch(tables, lens, 16, 4, 2, 16, torch.float32, DEVICE)
    out = paged_decode_attention(
        batch.query, batch.key_cache, batch.value_cache, batch.layout.block_tables,
        batch.layout.context_lens, backend="triton",
    )  # fmt: skip
    reference = reference_paged_decode(
        batch.query.cpu(), batch.key_cache.cpu(), batch.value_cache.cpu(),
        batch.layout.block_tables.cpu(), batch.layout.context_lens.cpu(),
    )  # fmt: skip
    assert (out.cpu().double() - reference).abs().max() <= 1e-5 * reference.abs().max()
