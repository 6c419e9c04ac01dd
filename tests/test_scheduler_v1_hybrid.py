"""``paged_hybrid`` and ``paged_hybrid_prefix`` under ``scheduler=vllm_v1``: vLLM's hybrid
KV-cache manager (sliding-window groups beside full ones, one pool) under chunked prefill, its
admission cap and checks, async scheduling's processed-token basis, and its prefix caching (hits
every group serves, the junction, the free queue's order, async catch-up); against real vLLM's
scheduler step for step (peer)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee_support import agrees_with_vllm, kvbench_v1_steps, peer
from test_paged_hybrid import count_cohort_rounds, hybrid_over, random_layout
from test_scheduler_v1_prefix_referee import workloads as prefix_workloads
from test_scheduler_v1_referee import SLICE_LIMITS, TRACE_SLICES
from test_scheduler_v1_simulate import random_limits

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.kv_capacity import NUM_NULL_BLOCKS, hybrid_pool
from kvbench.core.kv_groups import KvCacheGroup, KvGroupLayout
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel
from kvbench.engine.records import EXCEEDS_POOL
from kvbench.engine.scheduler_v1 import V1Limits
from kvbench.engine.simulate_v1 import chunks_shape, simulate_v1
from kvbench.tasks.simulate.experiment import v1_memory
from kvbench.tools.async_gap import trace_slice

SLIDING = (None, 8)  # one full group, one sliding group of 8 tokens
# One request: a 64-token prompt in chunks of 16, then 2 output tokens, blocks of 4 tokens.
CHUNKED = ([Request(0, 0.0, 64, 2)], 4, 100, V1Limits(8, 16, 256), None)
# A 100-token prompt in chunks of 16: a sliding group's admission cap is
# ceil(min(8 - 1 + 16, 256) / 4) + 1 = 7 blocks, the full group needs all 25.
CAPPED = [Request(0, 0.0, 100, 1)]


def test_chunked_prefill_frees_the_sliding_groups_blocks_behind_the_window() -> None:
    requests, block_size, num_gpu_blocks, limits, _ = CHUNKED
    hybrid = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, windows=SLIDING)
    uniform = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, windows=(None, None))
    assert [step.scheduled_tokens for step in hybrid] == [((0, 16),)] * 4 + [((0, 1),)]
    # Full group: 4, 8, 12, 16, 17 blocks. Sliding group, with n tokens computed before a step:
    # the first (n - 8 + 1) // 4 blocks are freed, then the chunk's are added: 4; 2 + 4 = 6;
    # 2 + 4; 2 + 4; and before the decode (n = 64) 2 + 1.
    assert [step.num_blocks_in_use for step in hybrid] == [8, 14, 18, 22, 20]
    assert [step.num_blocks_in_use for step in uniform] == [8, 16, 24, 32, 34]


@pytest.mark.parametrize(("num_blocks", "admitted"), [(32, True), (31, False)])
def test_admission_caps_a_sliding_groups_blocks_at_its_window_and_a_budget(
    num_blocks: int, admitted: bool
) -> None:
    # The whole input needs 25 + min(25, 7) = 32 blocks, not 50: a pool of 32 admits it (it
    # peaks at 24 + 6 = 30), one of 31 never does.
    limits = V1Limits(8, 16, 256)
    if admitted:
        steps = kvbench_v1_steps(CAPPED, 4, num_blocks + NUM_NULL_BLOCKS, limits, windows=SLIDING)
        assert max(step.num_blocks_in_use for step in steps) == 30
    else:
        with pytest.raises(ValueError, match="no waiting request fits the pool"):
            kvbench_v1_steps(CAPPED, 4, num_blocks + NUM_NULL_BLOCKS, limits, windows=SLIDING)


def test_async_scheduling_places_the_window_after_the_tokens_that_returned() -> None:
    # The same request scheduled asynchronously: each chunk is still in flight when the next is
    # scheduled, so the sliding group frees behind the window one step later, and vLLM's
    # admission cap counts two steps' budgets in flight.
    requests, block_size, num_gpu_blocks, _, _ = CHUNKED
    async_limits = V1Limits(8, 16, 256, async_scheduling=True)
    steps = kvbench_v1_steps(requests, block_size, num_gpu_blocks, async_limits, windows=SLIDING)
    # Sliding group: 4; nothing returned yet, 8; 16 returned, 8 - 2 + 4 = 10; 32: 12 - 6 + 4.
    assert [step.num_blocks_in_use for step in steps[:4]] == [8, 16, 22, 26]
    # The cap: ceil((8 - 1 + 2 x 16) / 4) + 1 = 11 blocks, so the 100-token prompt needs 36.
    kvbench_v1_steps(CAPPED, 4, 36 + NUM_NULL_BLOCKS, async_limits, windows=SLIDING)
    with pytest.raises(ValueError, match="no waiting request fits the pool"):
        kvbench_v1_steps(CAPPED, 4, 35 + NUM_NULL_BLOCKS, async_limits, windows=SLIDING)


# Three 80-token prompts sharing their first 64 tokens, arriving at steps 0, 5 and 10.
SHARED = ([Request(i, 0.0, 80, 2, prefix_group=1, prefix_tokens=64) for i in range(3)], 4, 200,
          V1Limits(8, 128, 256), [0, 5, 10])  # fmt: skip


def test_a_hybrid_hit_needs_every_group_and_the_junction_makes_the_next_one() -> None:
    # Request 0 caches its 20 full blocks in the full group, but in the sliding group (window 8:
    # a hit needs its last 2 blocks) only the tail before its replay boundary, blocks 17-18,
    # its own. Request 1's full group finds the 16 shared blocks, its sliding group no tail
    # among them: it hits nothing, and pins the junction at 64 tokens, so its sliding group
    # keeps blocks 14-15. Request 2 hits all 64 shared tokens.
    requests, block_size, num_gpu_blocks, limits, arrivals = SHARED
    steps = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, arrivals,
                             prefix_caching=True, windows=SLIDING)  # fmt: skip
    hits = [(step.step_index, step.prefix_query_tokens, step.prefix_hit_tokens)
            for step in steps if step.prefix_query_tokens]  # fmt: skip
    assert hits == [(0, 80, 0), (5, 80, 0), (10, 80, 64)]
    uniform = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, arrivals,
                               prefix_caching=True, windows=(None, None))  # fmt: skip
    assert [step.prefix_hit_tokens for step in uniform if step.prefix_query_tokens] == [0, 64, 64]


# Request 0 (40 prompt tokens, 12 out) runs; request 1 shares its prompt and arrives at step 14,
# when two blocks are free. Blocks of 1 token, a window of 2: a hit needs 1 sliding block.
CHUNK_BOUND = ([Request(i, 0.0, 40, out, prefix_group=0, prefix_tokens=40)
                for i, out in enumerate((12, 2))], 1, 55, V1Limits(8, 8, 256), [0, 14])  # fmt: skip


def test_admission_also_needs_the_first_chunks_blocks_past_a_long_hit() -> None:
    # Request 1 hits 39 tokens: the full group's blocks (held by request 0) and the sliding
    # group's block 38 (freed behind request 0's window, still cached). The whole input needs
    # 1 full block, and the sliding group none past the hit (its cap is 10 blocks), plus that
    # free cached block: 2 blocks, which fit. The first chunk (1 token) needs a block in each
    # group: 3. vLLM checks both, so request 1 waits until request 0 finishes (step 15).
    requests, block_size, num_gpu_blocks, limits, arrivals = CHUNK_BOUND
    steps = kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, arrivals,
                             prefix_caching=True, windows=(None, 2))  # fmt: skip
    assert [step.num_waiting for step in steps[13:17]] == [0, 1, 1, 0]
    assert [(step.step_index, step.prefix_hit_tokens)
            for step in steps if step.prefix_query_tokens] == [(0, 0), (16, 39)]  # fmt: skip


def test_a_chunk_carries_its_span_for_the_sliding_layers_exact_pairs() -> None:
    # A 3,000-token prompt's third chunk of 1,000 and a decode: the roofline's window term
    # counts the chunk's pairs from its span (2,000 cached before it, 3,000 after).
    shape = chunks_shape([(3000, 2000, 1000), (50, 60, 1)])
    assert shape.prefill_spans == ((3000, 2000),)
    assert (shape.num_prefill_tokens, shape.num_decode_tokens) == (1000, 1)


def test_gemma_3_under_v1_holds_less_and_batches_more_than_uniform_paging() -> None:
    # 24 requests of 6,000-token prompts on a pool of 5,000 blocks of 16 tokens x 10 layers:
    # uniform paging holds every layer's whole context, so it fits at most two such requests;
    # the hybrid manager keeps the 52 sliding layers' last 1,024 tokens only.
    deployment = get_deployment("gemma-3-27b", "h200-141gb")
    requests = [Request(i, 0.1 * i, 6000, 200) for i in range(24)]
    limits = V1Limits(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=131072)
    batches = {}
    for name in ("paged", "paged_hybrid"):
        pool = hybrid_pool(deployment, 16, 5001)
        assert pool is not None
        allocator = make_allocator(name, pool.num_slots, 16, limits.max_model_len,
                                   hybrid_pool=pool)  # fmt: skip
        result = simulate_v1(requests, v1_memory(name, allocator, limits), limits,
                             RooflineCostModel(deployment), allocator.num_slots)  # fmt: skip
        columns = result.steps.columns
        assert all(record.status == "finished" for record in result.requests)
        num_pool_blocks = 5000 if name == "paged_hybrid" else allocator.num_slots // 16
        assert max(columns["num_blocks_in_use"]) <= num_pool_blocks
        batches[name] = sum(columns["batch_size"]) / len(columns["batch_size"])
    assert batches["paged_hybrid"] > 2 * batches["paged"]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_lazy_decodes_give_the_reference_loops_records(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hybrid manager's decoding requests advance lazily (``HybridDecodeCohort``),
    synchronously or not: the records, the free queue in reuse order and the usage are the
    reference loop's on random workloads (layouts of full and sliding groups, with padding
    layers; blocks of 1-32 tokens; pools from one that preempts to roomy ones), and the
    cohort's rounds do free blocks behind windows, catch up after a prefill, start blocks."""
    import random

    counts = count_cohort_rounds(monkeypatch)
    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    num_preempted = 0
    for seed in range(40):
        rng = random.Random(seed)
        limits = random_limits(rng, async_scheduling)
        layout = random_layout(rng)
        span_s = rng.choice([0.5, 5.0, 50.0])
        requests = [Request(request_id, rng.random() * span_s, rng.randint(0, 300),
                            rng.randint(0, 120))
                    for request_id in range(rng.randint(1, 60))]  # fmt: skip
        num_blocks = rng.choice([40, 100, 300, 2000])
        block_size = rng.choice([1, 2, 4, 16, 32])
        runs = []
        for fast in (True, False):
            allocator = hybrid_over(num_blocks, block_size, layout, limits.max_model_len)
            result = simulate_v1(requests, v1_memory("paged_hybrid", allocator, limits), limits,
                                 cost_model, allocator.num_slots, fast=fast)  # fmt: skip
            runs.append((result.steps.columns,
                         [dataclasses.astuple(record) for record in result.requests],
                         allocator.free_blocks(), allocator.usage()))  # fmt: skip
        assert runs[0] == runs[1], seed
        num_preempted += sum(runs[1][0]["num_preempted"])
    assert num_preempted > 0
    assert len(counts) == 3 and min(counts.values()) > 100, counts


def test_a_request_whose_groups_outgrow_the_pool_as_it_decodes_is_rejected() -> None:
    # One full and one 8-token sliding group of one layer each, padded to two: 40 blocks of 4
    # tokens hold 160 slots of the model, so a 160-token request passes the arrival check, and
    # its 80-token prompt the admission's (20 blocks, 19 for the sliding group's cap), but as it
    # decodes its full group comes to need all 40 blocks beside the sliding group's 2 or 3:
    # once the pool is full it preempts itself, and would forever. It is rejected; the next
    # one is served.
    groups = (KvCacheGroup(None, 1), KvCacheGroup(8, 1))
    layout = KvGroupLayout(groups, group_size=2, num_model_layers=2)
    limits = V1Limits(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512)
    requests = [Request(0, 0.0, 80, 80), Request(1, 0.0, 20, 5)]
    for fast in (True, False):
        allocator = hybrid_over(40, 4, layout, limits.max_model_len)
        assert allocator.num_slots == 160
        result = simulate_v1(requests, v1_memory("paged_hybrid", allocator, limits), limits,
                             RooflineCostModel(get_deployment("opt-13b", "a100-40gb")),
                             allocator.num_slots, fast=fast)  # fmt: skip
        first, second = result.requests
        assert (first.status, first.reject_reason, second.status) == (
            "rejected", EXCEEDS_POOL, "finished")
        assert first.num_preemptions >= 1


# The async catch-up case of the paged_prefix comparison (test_scheduler_v1_async.CATCH_UP) on
# two full groups over 70 blocks of one token: request 3 is preempted in step 11, resumes in 14.
CATCH_UP = ([Request(0, 0.0, 1, 13), Request(1, 0.0, 2, 16), Request(2, 0.0, 1, 1),
             Request(3, 0.0, 1, 12)], 1, 71, V1Limits(4, 130, 256, async_scheduling=True),
            None)  # fmt: skip


def test_async_a_taken_in_token_caches_the_block_it_fills_in_every_group() -> None:
    # Each finishing request's last blocks are cached when its last token is taken in, just
    # before it frees them, so they join the free queue's back, and the allocations of step 14
    # take request 3's cached blocks from the front instead: it resumes with 2 of its 12 tokens
    # cached (real vLLM's answer, test_the_pinned_cases_agree_with_vllm); without the catch-up,
    # 4.
    steps = kvbench_v1_steps(*CATCH_UP, prefix_caching=True, windows=(None, None))
    assert steps[11].preempted_request_ids == (3,)
    assert (steps[14].resumed_query_tokens, steps[14].resumed_hit_tokens) == (12, 2)


@st.composite
def hybrid_workloads(
    draw: st.DrawFn, async_scheduling: bool = False
) -> tuple[tuple[list[Request], int, int, V1Limits, list[int] | None], tuple[int | None, ...]]:
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    windows = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 80)), min_size=1,
                                  max_size=4)))  # fmt: skip
    requests = [
        Request(request_id, 0.0, draw(st.integers(1, 120)), draw(st.integers(1, 40)))
        for request_id in range(draw(st.integers(1, 10)))
    ]
    # From a pool that holds one request in every group (preempting often) to roomier ones.
    largest_blocks = max(-(-request.total_tokens // block_size) for request in requests)
    num_gpu_blocks = largest_blocks * len(windows) + NUM_NULL_BLOCKS + draw(st.integers(0, 60))
    limits = V1Limits(max_num_seqs=draw(st.integers(1, 8)),
                      max_num_batched_tokens=draw(st.integers(8, 160)), max_model_len=256,
                      async_scheduling=async_scheduling)  # fmt: skip
    arrival_steps = draw(st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=len(requests),
                                                       max_size=len(requests))))  # fmt: skip
    return (requests, block_size, num_gpu_blocks, limits, arrival_steps), windows


@st.composite
def hybrid_prefix_workloads(
    draw: st.DrawFn, async_scheduling: bool = False
) -> tuple[tuple[list[Request], int, int, V1Limits, list[int] | None], tuple[int | None, ...]]:
    """The prefix-sharing workloads of the paged_prefix comparison, on one to four groups, the
    pool scaled to them (from holding one request in every group up)."""
    requests, block_size, num_gpu_blocks, limits, arrival_steps = draw(prefix_workloads())
    limits = dataclasses.replace(limits, async_scheduling=async_scheduling)
    windows = tuple(draw(st.lists(st.one_of(st.none(), st.integers(1, 80)), min_size=1,
                                  max_size=4)))  # fmt: skip
    num_gpu_blocks = (num_gpu_blocks - NUM_NULL_BLOCKS) * len(windows) + NUM_NULL_BLOCKS
    return (requests, block_size, num_gpu_blocks, limits, arrival_steps), windows


# Found by the test: request 5 is preempted when it cannot grow, after its sliding group freed
# its block 0 behind the window, which vLLM's free queue then evicts first (before the full
# group's blocks freed by the preemption), so its resumed lookup misses (a pinned case now).
EVICTED_FIRST = (([Request(i, 0.0, prompt, out) for i, (prompt, out) in
                   enumerate([(101, 31), (1, 1), (1, 1), (17, 3), (11, 23), (57, 10), (1, 1)])],
                  1, 381, V1Limits(3, 8, 256), None), (None, 65))  # fmt: skip


@peer
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_pinned_cases_agree_with_vllm(async_scheduling: bool) -> None:
    requests, block_size, num_gpu_blocks, _, _ = CHUNKED
    limits = V1Limits(8, 16, 256, async_scheduling)
    agrees_with_vllm((requests, block_size, num_gpu_blocks, limits, None), prefix_caching=False,
                     windows=SLIDING)  # fmt: skip
    # The smallest pool that admits the capped request (sync: 32 blocks, async: 36), and one
    # block more than the sync cap asks for, which async refuses: vLLM raises as kvbench does.
    smallest = 36 if async_scheduling else 32
    capped = (CAPPED, 4, smallest + NUM_NULL_BLOCKS, limits, None)
    agrees_with_vllm(capped, prefix_caching=False, windows=SLIDING)
    if async_scheduling:
        agrees_with_vllm(CATCH_UP, prefix_caching=True, windows=(None, None))
    else:
        agrees_with_vllm(SHARED, prefix_caching=True, windows=SLIDING)
        agrees_with_vllm(CHUNK_BOUND, prefix_caching=True, windows=(None, 2))
        workload, windows = EVICTED_FIRST
        agrees_with_vllm(workload, prefix_caching=True, windows=windows)


def _agrees_on_a_drawn_workload(
    data: st.DataObject, prefix_caching: bool, async_scheduling: bool
) -> None:
    strategy = hybrid_prefix_workloads if prefix_caching else hybrid_workloads
    workload, windows = data.draw(strategy(async_scheduling=async_scheduling))
    agrees_with_vllm(workload, prefix_caching=prefix_caching, windows=windows)


@peer
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_paged_hybrid_under_v1_agrees_with_vllm_step_for_step(
    prefix_caching: bool, async_scheduling: bool, data: st.DataObject
) -> None:
    _agrees_on_a_drawn_workload(data, prefix_caching, async_scheduling)


@peer
@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
@settings(max_examples=1000, deadline=None)
@given(data=st.data())
def test_paged_hybrid_under_v1_agrees_with_vllm_on_a_thousand_workloads(
    prefix_caching: bool, async_scheduling: bool, data: st.DataObject
) -> None:
    _agrees_on_a_drawn_workload(data, prefix_caching, async_scheduling)


@peer
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("trace", TRACE_SLICES)
def test_paged_hybrid_under_v1_agrees_with_vllm_on_trace_slices(  # type: ignore[no-untyped-def]
    shared_traces, trace, prefix_caching
) -> None:
    # Gemma-3's pattern (a full group beside five sliding groups of 1,024 tokens) on the slices'
    # 8K-context engine, 2,400 blocks of 16: the longest requests' full group and the sliding
    # groups' admission caps fill it, so the pool preempts. With prefix caching, Mooncake's
    # shared prompt blocks and resumed requests' own blocks hit.
    requests, arrivals = trace_slice(shared_traces / trace)
    case = (requests, 16, 2400, SLICE_LIMITS, arrivals)
    windows = (None,) + (1024,) * 5
    assert agrees_with_vllm(case, prefix_caching=prefix_caching, windows=windows) > 80
