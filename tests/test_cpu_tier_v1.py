"""vLLM v1's CPU offloading (``engine.cpu_tier_v1``, ``scheduler=vllm_v1`` with a CPU tier)
against the real ``OffloadingConnector`` driven by vLLM's scheduler (``referee.vllm_v1`` with
``num_cpu_blocks``), step for step: every compared field of every step, the tokens loaded from
the CPU and the blocks the tier holds included, must be identical."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from referee_support import agrees_with_vllm, kvbench_v1_steps, peer
from test_scheduler_v1_prefix_referee import PREFIX_TRACE_SLICES, SLICE_LIMITS, trace_slice
from test_scheduler_v1_prefix_referee import workloads as prefix_workloads

from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.request import Request
from kvbench.engine.cpu_tier_policy_v1 import ArcPolicy, LruPolicy
from kvbench.engine.cpu_tier_v1 import VLLM_DEFAULTS, CpuOffloadTier, CpuTierPolicy
from kvbench.engine.kv_cache_v1 import V1Sequence
from kvbench.engine.scheduler_v1 import V1Limits

Case = tuple[list[Request], int, int, V1Limits, "list[int] | None"]
SHARED = dict(prefix_group=1, prefix_tokens=48)


def _evicting_case() -> Case:
    """A pool of 8 blocks of 16: request 1 (100 tokens) evicts request 0's prompt from the GPU
    but for one block; requests 2 and 3 share that prompt's 48 tokens."""
    requests = [Request(0, 0.0, 50, 20, **SHARED), Request(1, 0.0, 100, 3),  # type: ignore[arg-type]
                Request(2, 0.0, 50, 3, **SHARED), Request(3, 0.0, 50, 3, **SHARED)]  # type: ignore[arg-type]  # fmt: skip
    return requests, 16, 9, V1Limits(4, 128, 128), [0, 30, 40, 41]


def _steps_of(case: Case, num_cpu_blocks: int, policy: CpuTierPolicy = VLLM_DEFAULTS):  # type: ignore[no-untyped-def]
    requests, block_size, num_gpu_blocks, limits, arrivals = case
    return kvbench_v1_steps(requests, block_size, num_gpu_blocks, limits, arrivals,
                            prefix_caching=True, num_cpu_blocks=num_cpu_blocks,
                            cpu_tier_policy=policy)  # fmt: skip


def test_a_request_loads_what_the_gpu_evicted_and_waits_a_step_outside_the_batch() -> None:
    # What real vLLM does on this case (test below): request 2 hits one block on the GPU and
    # loads two from the CPU in step 40, holding 3 blocks while it waits; in step 41 it computes
    # its last 2 tokens, and request 3 finds all 48 shared tokens on the GPU, cached at the load.
    steps = {step.step_index: step for step in _steps_of(_evicting_case(), 20)}
    load = steps[40]
    assert (load.scheduled_tokens, load.num_blocks_in_use, load.num_waiting) == ((), 3, 1)
    assert (load.prefix_hit_tokens, load.cpu_hit_tokens) == (16, 32)
    assert steps[41].scheduled_tokens == ((2, 2), (3, 2))
    assert steps[41].prefix_hit_tokens == 48
    # Prompt blocks only: request 0's 70 tokens fill 4 blocks, its prompt 3; request 1 adds 6.
    assert [steps[i].num_cpu_blocks for i in (0, 30, 40)] == [3, 9, 9]


def test_without_a_cpu_tier_the_evicted_prompt_is_recomputed() -> None:
    steps = {step.step_index: step for step in _steps_of(_evicting_case(), 0)}
    assert steps[40].scheduled_tokens == ((2, 34),)
    assert all(step.cpu_hit_tokens == 0 for step in steps.values())


def test_a_store_is_readable_a_step_later_and_a_block_being_loaded_is_waited_for() -> None:
    shared = dict(prefix_group=1, prefix_tokens=8)
    first, second, third = (V1Sequence(Request(i, 0.0, 8, 1, **shared)) for i in range(3))  # type: ignore[arg-type]
    tier = CpuOffloadTier(num_chunks=4, block_size=4)
    tier.offer(first, 8, 2)
    tier.end_schedule(set())
    tier.complete_step()  # the worker copies it at the start of the next step
    assert tier.lookup(second, 0) is None  # a hit still being stored: wait a step
    tier.end_schedule(set())
    tier.complete_step()
    assert tier.lookup(second, 0) == 2  # the whole prompt (the GPU then recomputes its last)
    tier.start_load(second, 0, 2)
    assert tier.lookup(third, 0) is None  # its blocks are being loaded for another request
    tier.end_schedule(set())
    assert tier.complete_step() == [1]  # a load completes in its step
    assert tier.lookup(third, 0) == 2


def test_a_tier_of_chunks_stores_and_hits_whole_chunks_from_the_one_the_gpu_hit_ends_in() -> None:
    # Chunks of 2 blocks of 4 tokens. A 27-token prompt fills 6 blocks (3 chunks) and part of a
    # seventh.
    shared = dict(prefix_group=1, prefix_tokens=27)
    first, second = (V1Sequence(Request(i, 0.0, 27, 1, **shared)) for i in range(2))  # type: ignore[arg-type]
    tier = CpuOffloadTier(num_chunks=8, block_size=4, policy=CpuTierPolicy(blocks_per_chunk=2))
    tier.offer(first, 20, 5)  # 5 blocks computed: 2 whole chunks
    assert (tier.num_stored_blocks, tier.num_held_chunks) == (4, 2)
    tier.offer(first, 27, 7)
    assert (tier.num_stored_blocks, tier.num_held_chunks) == (6, 3)
    for _ in range(2):  # copied at the start of the next step, readable after it
        tier.end_schedule(set())
        tier.complete_step()
    assert tier.lookup(second, 0) == 6
    assert tier.lookup(second, 1) == 5  # from chunk 0, whose first block the GPU holds
    assert tier.lookup(second, 4) == 2
    assert tier.lookup(second, 5) == 0  # 1 block: less than a chunk
    partial = V1Sequence(Request(2, 0.0, 27, 1, prefix_group=1, prefix_tokens=8))
    assert tier.lookup(partial, 0) == 2  # it shares the first chunk only
    assert tier.lookup(partial, 1) == 0  # 1 block past its GPU hit: less than a chunk
    tier.start_load(second, 1, 5)
    tier.end_schedule(set())
    assert tier.last_copies.loads == [(2, 5 * 4)]  # job 2 copies the 5 blocks the GPU lacks


def test_a_tier_full_of_blocks_in_flight_drops_the_offer_and_retries_it() -> None:
    tier = CpuOffloadTier(num_chunks=2, block_size=4)
    first, second = V1Sequence(Request(0, 0.0, 8, 1)), V1Sequence(Request(1, 0.0, 8, 1))
    tier.offer(first, 8, 2)
    tier.offer(second, 8, 2)  # both of the tier's blocks are still being stored
    assert (tier.num_stored_blocks, tier.num_dropped_offers) == (2, 1)
    tier.end_schedule(set())
    tier.complete_step()
    tier.end_schedule(set())
    tier.complete_step()  # the first request's store completes: readable, evictable
    tier.offer(second, 8, 2)  # retried: evicts the first request's blocks
    assert (tier.num_stored_blocks, tier.num_held_chunks) == (4, 2)
    assert tier.lookup(first, 0) == 0
    assert tier.lookup(second, 0) is None  # its own store is in flight: it would wait


def test_the_least_recently_used_block_goes_first_and_a_finished_prompt_head_last() -> None:
    tier = CpuOffloadTier(num_chunks=3, block_size=1)
    seq = V1Sequence(Request(0, 0.0, 3, 1))
    tier.offer(seq, 3, 3)
    tier.end_schedule(set())
    tier.complete_step()
    tier.end_schedule(set())
    tier.complete_step()  # readable
    tier.finished(seq)
    tier.end_schedule(set())  # its blocks used again, the first one last
    newcomer = V1Sequence(Request(1, 0.0, 1, 1))
    tier.offer(newcomer, 1, 1)  # evicts one block: the prompt's tail
    assert tier.lookup(V1Sequence(Request(0, 0.0, 3, 1)), 0) == 2


def test_the_cpu_tier_rejects_an_empty_size() -> None:
    with pytest.raises(ValueError, match="num_chunks=0"):
        CpuOffloadTier(num_chunks=0, block_size=16)


def test_async_a_load_is_taken_in_a_step_later_and_its_blocks_wait_for_it() -> None:
    # Real vLLM, async (test below): request 2 loads in step 40; the answer comes back after
    # step 41 is scheduled, in which request 3, whose GPU hit ends where the load begins, is
    # skipped; both compute in step 42.
    requests, block_size, num_gpu_blocks, limits, arrivals = _evicting_case()
    case = (requests, block_size, num_gpu_blocks,
            dataclasses.replace(limits, async_scheduling=True), arrivals)  # fmt: skip
    steps = {step.step_index: step for step in _steps_of(case, 20)}
    assert steps[40].cpu_hit_tokens == 32
    assert (steps[41].scheduled_tokens, steps[41].num_waiting) == ((), 2)
    assert steps[42].scheduled_tokens == ((2, 2), (3, 2))


@peer
def test_the_hand_cases_are_vllms() -> None:
    assert agrees_with_vllm(_evicting_case(), prefix_caching=True, num_cpu_blocks=20) == 44
    requests, block_size, num_gpu_blocks, limits, arrivals = _evicting_case()
    async_case = (requests, block_size, num_gpu_blocks,
                  dataclasses.replace(limits, async_scheduling=True), arrivals)  # fmt: skip
    agrees_with_vllm(async_case, prefix_caching=True, num_cpu_blocks=20)
    assert agrees_with_vllm(_evicting_case(), prefix_caching=True, num_cpu_blocks=2) == 44


@st.composite
def shared_prompt_workloads(draw: st.DrawFn) -> Case:
    """Requests most of which open with one of four shared prompts, arriving over 80 steps on a
    pool little larger than the largest: the GPU evicts prompts the CPU tier still holds."""
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    requests = []
    for request_id in range(draw(st.integers(2, 20))):
        identity: dict[str, int] = {}
        prompt_tokens = draw(st.integers(1, 120))
        if draw(st.booleans()) or draw(st.booleans()):
            shared_tokens = draw(st.integers(8, 100))
            identity = dict(prefix_group=draw(st.integers(0, 3)), prefix_tokens=shared_tokens)
            prompt_tokens = min(shared_tokens + draw(st.integers(0, 40)), 200)
        requests.append(Request(request_id, 0.0, prompt_tokens, draw(st.integers(1, 20)),
                                **identity))  # type: ignore[arg-type]  # fmt: skip
    largest_blocks = max(-(-request.total_tokens // block_size) for request in requests)
    limits = V1Limits(max_num_seqs=draw(st.integers(1, 8)),
                      max_num_batched_tokens=draw(st.integers(16, 256)),
                      max_model_len=256)  # fmt: skip
    arrivals = sorted(draw(st.lists(st.integers(0, 80), min_size=len(requests),
                                    max_size=len(requests))))  # fmt: skip
    num_gpu_blocks = largest_blocks + NUM_NULL_BLOCKS + draw(st.integers(0, 10))
    return requests, block_size, num_gpu_blocks, limits, arrivals


TIER_SIZES = st.integers(1, 100)


def _livelocks_vllm(case: Case) -> bool:
    """A 1-token prompt with blocks of 1 token: vLLM reloads it whole forever (below)."""
    requests, block_size, *_ = case
    return block_size == 1 and any(request.prompt_tokens == 1 for request in requests)


def _one_token_prompt_case() -> Case:
    shared = dict(prefix_group=1, prefix_tokens=1)
    requests = [Request(0, 0.0, 1, 1, **shared), Request(1, 0.0, 8, 1),  # type: ignore[arg-type]
                Request(2, 0.0, 1, 1, **shared)]  # type: ignore[arg-type]  # fmt: skip
    return requests, 1, 10, V1Limits(4, 16, 16), [0, 3, 6]


def test_a_one_token_prompt_loaded_whole_computes_its_token_and_finishes() -> None:
    steps = _steps_of(_one_token_prompt_case(), 4)
    load = next(step for step in steps if step.cpu_hit_tokens)
    assert (load.step_index, load.cpu_hit_tokens) == (6, 1)
    assert steps[7].scheduled_tokens == ((2, 1),) and steps[7].finished_request_ids == (2,)


@peer
def test_vllm_reloads_a_one_token_prompt_loaded_whole_forever() -> None:
    # vLLM 0.32 sets a request whose whole input was loaded to recompute its last token, here
    # its only one: 0 computed tokens, which its scheduler reads as a new request, so it looks
    # the prompt up and loads it again, every step. kvbench lets it compute (docs/referee.md).
    from kvbench.referee.vllm_v1 import RefereeLimits, run_referee

    requests, block_size, num_gpu_blocks, limits, arrivals = _one_token_prompt_case()
    referee_limits = RefereeLimits(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                   max_num_seqs=limits.max_num_seqs,
                                   max_num_batched_tokens=limits.max_num_batched_tokens,
                                   max_model_len=limits.max_model_len, enable_prefix_caching=True,
                                   num_cpu_blocks=4)  # fmt: skip
    with pytest.raises(RuntimeError, match="ran 300 steps without finishing"):
        run_referee(requests, referee_limits, arrivals, max_steps=300)


@st.composite
def tiered_workloads(draw: st.DrawFn) -> tuple[Case, int]:
    """A workload of either kind above, scheduled synchronously or not, and a tier's size (none
    that livelocks vLLM)."""
    requests, block_size, num_gpu_blocks, limits, arrivals = draw(
        st.one_of(prefix_workloads(), shared_prompt_workloads()))  # fmt: skip
    limits = dataclasses.replace(limits, async_scheduling=draw(st.booleans()))
    case = (requests, block_size, num_gpu_blocks, limits, arrivals)
    assume(not _livelocks_vllm(case))
    return case, draw(TIER_SIZES)


@peer
@settings(max_examples=60, deadline=None)
@given(case_and_tier=tiered_workloads())
def test_kvbench_v1_with_a_cpu_tier_agrees_with_vllm_step_for_step(case_and_tier) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1])


@peer
@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(case_and_tier=tiered_workloads())
def test_kvbench_v1_with_a_cpu_tier_agrees_with_vllm_on_a_thousand(case_and_tier) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1])


@peer
@pytest.mark.parametrize(("trace", "system_prompt_tokens"), PREFIX_TRACE_SLICES)
@pytest.mark.parametrize("num_cpu_blocks", [300, 3000])
def test_kvbench_v1_with_a_cpu_tier_agrees_with_vllm_on_trace_slices(
    shared_traces, trace, system_prompt_tokens, num_cpu_blocks
) -> None:  # type: ignore[no-untyped-def]
    requests, arrivals = trace_slice(shared_traces / trace, system_prompt_tokens)
    case = (requests, 16, 1200, SLICE_LIMITS, arrivals)  # a pool that preempts and evicts
    assert agrees_with_vllm(case, prefix_caching=True, num_cpu_blocks=num_cpu_blocks) > 80


def test_generated_tokens_are_stored_too_when_not_prompt_only() -> None:
    # Request 0's prompt is 50 tokens, computed in step 0; its decode steps compute tokens 50,
    # 51, ...: step 14 computes token 63 and so fills block 3 (tokens 48-63), which only a tier
    # storing generated tokens takes.
    held = {}
    for prompt_only in (True, False):
        steps = _steps_of(_evicting_case(), 20, CpuTierPolicy(offload_prompt_only=prompt_only))
        held[prompt_only] = [steps[index].num_cpu_blocks for index in (0, 13, 14)]
    assert held == {True: [3, 3, 3], False: [3, 3, 4]}


def test_a_prompt_larger_than_the_tier_is_not_stored_at_all() -> None:
    # vLLM stores a request's new blocks all or none: 3 prompt blocks never fit 2.
    steps = _steps_of(_evicting_case(), 2)
    assert {step.num_cpu_blocks for step in steps[:30]} == {0}
    assert sum(step.cpu_hit_tokens for step in steps) == 0


def test_simulated_on_the_clock_a_load_is_a_hit_of_the_cpu_tier_and_takes_its_copy_time() -> None:
    from kvbench.core.catalog import get_deployment
    from kvbench.engine import RooflineCostModel
    from kvbench.engine.kv_cache_v1 import V1KVCache
    from kvbench.engine.simulate_v1 import chunks_shape, simulate_v1

    requests, block_size, num_gpu_blocks, limits, _ = _evicting_case()
    # Arrivals far apart: each request runs alone, request 2 after request 1 evicted the prompt.
    requests = [dataclasses.replace(request, arrival_s=10.0 * index)
                for index, request in enumerate(requests)]  # fmt: skip
    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    num_blocks = num_gpu_blocks - NUM_NULL_BLOCKS
    records = {}
    for num_cpu_blocks in (0, 20):
        tier = CpuOffloadTier(num_cpu_blocks, block_size) if num_cpu_blocks else None
        memory = V1KVCache(num_blocks, block_size, limits.max_model_len, enable_caching=True,
                           cpu_tier=tier)  # fmt: skip
        result = simulate_v1(requests, memory, limits, cost_model, num_blocks * block_size)
        records[num_cpu_blocks] = {record.request_id: record for record in result.requests}
    loaded = records[20][2]
    assert (loaded.cached_prompt_tokens, loaded.cpu_cached_prompt_tokens) == (48, 32)
    assert records[0][2].cpu_cached_prompt_tokens == 0
    # The load-only step lasts the copy; then the request computes its last 2 tokens alone
    # (tokens 48-49 of its prompt): here a step longer than recomputing 34 tokens would save.
    last_chunk_s = cost_model.iteration_time_s(chunks_shape([(50, 48, 2)]))
    expected_s = cost_model.swap_time_s(32) + last_chunk_s
    assert loaded.first_token_s - loaded.admit_s == pytest.approx(expected_s, rel=1e-9)


def test_a_load_longer_than_a_step_overlaps_the_steps_of_the_others() -> None:
    from kvbench.core.catalog import get_deployment
    from kvbench.engine import RooflineCostModel
    from kvbench.engine.kv_cache_v1 import V1KVCache
    from kvbench.engine.simulate_v1 import chunks_shape, simulate_v1

    # OPT-13B on an A100: 928 tokens of K/V take longer over PCIe than a decode step computes.
    # Request 0 leaves its 1,000-token prompt in the CPU tier; request 1 evicts most of it from
    # the GPU's 100 blocks (not from the CPU's 400); request 2 decodes for long; request 3 loads
    # the rest meanwhile.
    shared = dict(prefix_group=4, prefix_tokens=1000)
    requests = [Request(0, 0.0, 1000, 1, **shared), Request(1, 1.0, 1500, 1),  # type: ignore[arg-type]
                Request(2, 2.0, 10, 300), Request(3, 2.5, 1000, 2, **shared)]  # type: ignore[arg-type]  # fmt: skip
    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    limits = V1Limits(8, 2048, 2048)
    memory = V1KVCache(100, 16, limits.max_model_len, enable_caching=True,
                       cpu_tier=CpuOffloadTier(400, 16))  # fmt: skip
    result = simulate_v1(requests, memory, limits, cost_model, 100 * 16)
    loaded = {record.request_id: record for record in result.requests}[3]
    # 4 blocks of its prompt stay on the GPU (the free queue evicts request 0's tail first).
    assert (loaded.cached_prompt_tokens, loaded.cpu_cached_prompt_tokens) == (992, 928)
    copy_s = cost_model.swap_time_s(928)
    decode_s = cost_model.iteration_time_s(chunks_shape([(10, 100, 1)]))
    assert copy_s > decode_s  # the copy outlasts a step
    steps = result.steps.columns
    # Request 2's steps while the copy runs are priced as decodes alone: none is stretched.
    rows = zip(steps["time_s"], steps["duration_s"], strict=True)
    during = [duration for time_s, duration in rows
              if loaded.admit_s <= time_s < loaded.admit_s + copy_s]  # fmt: skip
    assert len(during) >= 2 and max(during) < copy_s
    # The request computes its last prompt tokens once the copy is in.
    assert loaded.first_token_s >= loaded.admit_s + copy_s


def _scan_case() -> Case:
    """Requests 0 and 1 share a 48-token prompt (3 blocks of 16; 1 finds it in both tiers), then
    three one-off prompts pass one at a time (a scan), then request 5 asks for the shared prompt
    again, which the scan pushed out of the GPU's 8 blocks. The CPU tier holds 6 blocks."""
    shared = [Request(request_id, 0.0, 50, 3, **SHARED) for request_id in (0, 1, 5)]  # type: ignore[arg-type]
    requests = [*shared[:2], *(Request(request_id, 0.0, 50, 3) for request_id in (2, 3, 4)),
                shared[2]]  # fmt: skip
    return requests, 16, 9, V1Limits(4, 128, 128), [0, 10, 20, 30, 40, 50]


def _cpu_hits_by_step(steps) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {step.step_index: step.cpu_hit_tokens for step in steps if step.prefix_query_tokens}


def test_arc_keeps_a_reused_prompt_through_a_scan_that_lru_evicts() -> None:
    # LRU: the second scan prompt evicts the shared one, the least recently used. ARC: request 1
    # reused it (T2); the scan's prompts were used once (T1), and T1 goes first.
    lru = _cpu_hits_by_step(_steps_of(_scan_case(), 6, CpuTierPolicy("lru")))
    arc = _cpu_hits_by_step(_steps_of(_scan_case(), 6, CpuTierPolicy("arc")))
    assert lru[50] == 0
    assert arc[50] == 48
    assert {index: hits for index, hits in arc.items() if index != 50} == {
        index: hits for index, hits in lru.items() if index != 50}  # fmt: skip


def test_a_store_threshold_stores_a_block_at_its_second_offer_and_no_one_off() -> None:
    steps = {step.step_index: step for step in _steps_of(_scan_case(), 6, CpuTierPolicy("lru", 2))}
    assert steps[0].num_cpu_blocks == 0  # request 0 offers the shared prompt once
    assert steps[10].num_cpu_blocks == 3  # request 1 offers it again: stored
    assert max(step.num_cpu_blocks for step in steps.values()) == 3  # the scan is never stored
    assert steps[50].cpu_hit_tokens == 48


@pytest.mark.parametrize(("max_tracker_size", "num_stored"), [(64_000, 3), (2, 2), (1, 1)])
def test_a_full_offer_table_counts_no_more_blocks(max_tracker_size, num_stored) -> None:  # type: ignore[no-untyped-def]
    # Two requests offer the same 3 blocks. A full table forgets only blocks the offer does not
    # count: a table of 2 counts blocks 0 and 1 twice and block 2 never; one of 1, block 0.
    tier = CpuOffloadTier(10, 1, CpuTierPolicy("lru", 2, max_tracker_size))
    for request_id in (0, 1):
        prompt = Request(request_id, 0.0, 3, 1, prefix_group=1, prefix_tokens=3)
        tier.offer(V1Sequence(prompt), 3, 3)
    assert tier.num_stored_blocks == num_stored


def test_arc_evicts_from_t1_first_and_learns_from_a_ghost_hit() -> None:
    pins: dict[int, int] = {}
    arc = ArcPolicy(num_blocks=2, pins=pins)
    for block_hash in (1, 2):
        pins[block_hash] = 0
        arc.insert(block_hash)
    arc.on_request_finished([1], insertion_only=set(), reused={1})  # 1 reused: T2
    assert (list(arc.t1), list(arc.t2)) == ([2], [1])
    assert arc.evict(1, protected=set()) == [2]  # target 0: T1 first
    del pins[2]
    assert list(arc.b1) == [2]
    arc.on_store_miss([2])  # asked again: recency matters more
    assert arc.target_t1_blocks == 1.0
    assert arc.evict(2, protected=set()) is None  # only one evictable block: nothing moves
    assert (list(arc.t2), list(arc.b2)) == ([1], [])


def test_lru_evicts_by_recency_whatever_was_reused() -> None:
    pins = {1: 0, 2: 0}
    lru = LruPolicy(pins)
    for block_hash in (1, 2):
        lru.insert(block_hash)
    lru.on_request_finished([1], insertion_only=set(), reused={1})
    assert lru.evict(1, protected={1}) == [2]
    assert lru.evict(1, protected={1}) is None


@pytest.mark.parametrize(("policy", "message"), [
    (dict(eviction_policy="fifo"), "eviction_policy='fifo'"),
    (dict(store_threshold=-1), "store_threshold=-1"),
    (dict(max_tracker_size=0), "max_tracker_size=0"),
])  # fmt: skip
def test_the_tier_options_are_checked(policy, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        CpuTierPolicy(**policy)


@peer
@pytest.mark.parametrize(("policy", "num_steps"), [
    (CpuTierPolicy("lru"), 53), (CpuTierPolicy("arc"), 54), (CpuTierPolicy("lru", 2), 54),
    (CpuTierPolicy("arc", 3), 53),  # offered twice: never stored
])  # fmt: skip
def test_the_scan_case_is_vllms(policy, num_steps) -> None:  # type: ignore[no-untyped-def]
    # Request 5 waits a step outside the batch where it loads the shared prompt.
    assert agrees_with_vllm(_scan_case(), prefix_caching=True, num_cpu_blocks=6,
                            cpu_tier_policy=policy) == num_steps  # fmt: skip


# Small offer tables too: a full one forgets blocks, or, full of the offer's own, counts none.
POLICIES = st.builds(CpuTierPolicy, st.sampled_from(["lru", "arc"]), st.sampled_from([0, 2, 3]),
                     st.sampled_from([64_000, 1, 4, 16]), st.booleans(),
                     st.sampled_from([1, 2, 3, 4]))  # fmt: skip


@peer
@settings(max_examples=60, deadline=None)
@given(case_and_tier=tiered_workloads(), policy=POLICIES.filter(lambda p: p != CpuTierPolicy()))
def test_kvbench_v1_with_other_tier_options_agrees_with_vllm(case_and_tier, policy) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1],
                     cpu_tier_policy=policy)  # fmt: skip


@peer
@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(case_and_tier=tiered_workloads(), policy=POLICIES)
def test_any_tier_policy_agrees_with_vllm_on_a_thousand(case_and_tier, policy) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1],
                     cpu_tier_policy=policy)  # fmt: skip


@peer
def test_a_loaded_request_scheduled_at_last_flushes_a_store_on_its_hit_blocks() -> None:
    # Found by a 1,000-case draw (chunks of 2 blocks of 1 token, copies of a step a block).
    # In step 37 requests 8 and 0 start loading; request 2 hits the GPU block of its first
    # token, which request 8 holds too, and finishes: it stores its first chunk (that block and
    # its own). Scheduled in step 39, request 8 reaches vLLM's connector with all its blocks,
    # so that store is flushed (the step waits for it) and request 0's load, queued behind
    # request 8's, ends within the step: request 0 runs in step 40, not 41.
    # (prompt, output, prefix group, shared prefix tokens) of each request
    rows = [(2, 1, 1, 2), (1, 1, None, 0), (2, 1, 0, 1), (1, 1, None, 0), (1, 1, None, 0),
            (1, 1, None, 0), (59, 18, None, 0), (1, 1, None, 0), (56, 5, 0, 1),
            (76, 1, 1, 2)]  # fmt: skip
    requests = [Request(index, 0.0, prompt, output, prefix_group=group, prefix_tokens=shared)
                for index, (prompt, output, group, shared) in enumerate(rows)]  # fmt: skip
    case = (requests, 1, 131, V1Limits(2, 8, 256), [2, 0, 2, 0, 0, 0, 1, 0, 1, 0])
    assert agrees_with_vllm(case, prefix_caching=True, num_cpu_blocks=54,
                            cpu_tier_policy=CpuTierPolicy(blocks_per_chunk=2),
                            copy_steps_per_block=1.0) > 40  # fmt: skip


@peer
@settings(max_examples=60, deadline=None)
@given(case_and_tier=tiered_workloads(), blocks_per_chunk=st.integers(2, 5),
       copy_steps_per_block=st.sampled_from([0.0, 0.5]))  # fmt: skip
def test_a_tier_of_chunks_agrees_with_vllm_step_for_step(
    case_and_tier, blocks_per_chunk, copy_steps_per_block
) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1],
                     cpu_tier_policy=CpuTierPolicy(blocks_per_chunk=blocks_per_chunk),
                     copy_steps_per_block=copy_steps_per_block)  # fmt: skip


# The options on the five trace slices: ARC with a threshold; generated tokens stored; copies of
# a quarter step per block of 16 tokens (a long prompt's copies outlast several steps); chunks of
# 4 blocks (the same bytes: 75 chunks), their copies timed.
SLICE_OPTIONS = {
    "arc_threshold_2": dict(cpu_tier_policy=CpuTierPolicy("arc", 2)),
    "generated_tokens": dict(cpu_tier_policy=CpuTierPolicy(offload_prompt_only=False)),
    "timed_copies": dict(copy_steps_per_block=0.25),
    "chunks_of_4": dict(cpu_tier_policy=CpuTierPolicy(blocks_per_chunk=4), num_cpu_blocks=75,
                        copy_steps_per_block=0.25),
}


@peer
@pytest.mark.parametrize(("trace", "system_prompt_tokens"), PREFIX_TRACE_SLICES)
@pytest.mark.parametrize("option", SLICE_OPTIONS)
def test_kvbench_v1_with_other_tier_options_agrees_with_vllm_on_trace_slices(
    shared_traces, trace, system_prompt_tokens, option
) -> None:  # type: ignore[no-untyped-def]
    requests, arrivals = trace_slice(shared_traces / trace, system_prompt_tokens)
    case = (requests, 16, 1200, SLICE_LIMITS, arrivals)
    options = {"num_cpu_blocks": 300, **SLICE_OPTIONS[option]}
    assert agrees_with_vllm(case, prefix_caching=True, **options) > 80  # type: ignore[arg-type]


@pytest.mark.parametrize("prompt_tokens", [48, 1024])
def test_a_run_checks_its_stores_against_the_step_that_copies_them(prompt_tokens) -> None:  # type: ignore[no-untyped-def]
    from kvbench.core.catalog import get_deployment
    from kvbench.engine import RooflineCostModel
    from kvbench.engine.kv_cache_v1 import V1KVCache
    from kvbench.engine.simulate_v1 import simulate_v1

    # One request: its prefill step stores its prompt's blocks, its one decode step copies them.
    # OPT-13B on an A100: 48 tokens of K/V copy faster than a decode step, 1,024 do not.
    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    limits = V1Limits(8, 2048, 2048)
    memory = V1KVCache(100, 16, limits.max_model_len, enable_caching=True,
                       cpu_tier=CpuOffloadTier(400, 16))  # fmt: skip
    result = simulate_v1([Request(0, 0.0, prompt_tokens, 2)], memory, limits, cost_model, 1600)
    _prefill_s, decode_s = result.steps.columns["duration_s"]
    ratio = cost_model.swap_time_s(prompt_tokens) / decode_s
    assert result.cpu_store_step_ratio_max == pytest.approx(ratio, rel=1e-12)
    assert (ratio > 1) == (prompt_tokens == 1024)


def test_the_copy_clock_runs_each_direction_in_order_and_a_flush_delays_its_step() -> None:
    from kvbench.engine.cpu_tier_v1 import CopyClock, StepCopies

    clock = CopyClock(lambda num_tokens: num_tokens / 10, async_scheduling=False)
    clock.before_step(0.0)
    copies = StepCopies(stores=[(0, 20), (1, 10)], loads=[(2, 30)])
    assert clock.submit(copies, 0.0) == 0.0  # stores end at 2 and 3 (one after the other),
    clock.before_step(2.5)  # the load at 3 (its own direction)
    assert [clock.done(job_id) for job_id in (0, 1, 2)] == [True, False, False]
    assert clock.next_end_s(2.5) == 3.0
    # A step that flushes store 1 starts when it ends; a store submitted with it queues behind.
    assert clock.submit(StepCopies(stores=[(3, 10)], wait_job_ids=[1]), 2.5) == 3.0
    assert clock.next_end_s(3.0) == 4.0
    clock.before_step(3.5)
    assert [clock.done(job_id) for job_id in (1, 2, 3)] == [True, True, False]
    # Flushing a store already reported does not wait.
    assert clock.submit(StepCopies(wait_job_ids=[0]), 3.5) == 3.5


def test_async_the_copy_clock_answers_a_step_late() -> None:
    from kvbench.engine.cpu_tier_v1 import CopyClock, StepCopies

    clock = CopyClock(lambda num_tokens: 1.0, async_scheduling=True)
    clock.before_step(0.0)
    clock.submit(StepCopies(loads=[(0, 16)]), 0.0)  # ends at 1.0
    clock.before_step(1.5)  # takes in the answer of the step before the one at 0: none
    assert not clock.done(0)
    clock.before_step(2.0)  # takes in the answer of the step at 0, which ended at 1.5
    assert clock.done(0)


def _flush_case(arrival_after_store: float):  # type: ignore[no-untyped-def]
    """Request 0 (1,024 prompt tokens, one output token) finishes in its prefill step, whose
    stores the next step submits; request 1 arrives ``arrival_after_store`` copies of them
    later and reallocates request 0's GPU blocks. OPT-13B on an A100, 100 blocks of 16."""
    from kvbench.core.catalog import get_deployment
    from kvbench.engine import RooflineCostModel
    from kvbench.engine.kv_cache_v1 import V1KVCache
    from kvbench.engine.simulate_v1 import chunks_shape, simulate_v1

    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    prefill_s = cost_model.iteration_time_s(chunks_shape([(1024, 0, 1024)]))
    store_s = cost_model.swap_time_s(1024)
    requests = [Request(0, 0.0, 1024, 1),
                Request(1, prefill_s + arrival_after_store * store_s, 1500, 1)]  # fmt: skip
    limits = V1Limits(8, 2048, 2048)
    memory = V1KVCache(100, 16, limits.max_model_len, enable_caching=True,
                       cpu_tier=CpuOffloadTier(400, 16))  # fmt: skip
    return simulate_v1(requests, memory, limits, cost_model, 1600), prefill_s, store_s


def test_a_step_reallocating_the_blocks_of_a_store_in_flight_waits_for_it() -> None:
    # vLLM steps once more after request 0 finishes (submitting its stores then); request 1
    # arrives a quarter of the copy later and takes its blocks, so its step waits the rest.
    result, prefill_s, store_s = _flush_case(0.25)
    assert result.cpu_flush_wait_s == pytest.approx(0.75 * store_s, rel=1e-9)
    assert result.steps.columns["time_s"][1] == pytest.approx(prefill_s + store_s, rel=1e-9)
    # Arriving after the copy ended, it waits for nothing.
    result, prefill_s, _ = _flush_case(1.5)
    assert result.cpu_flush_wait_s == 0.0


# Steps per block of a copy (binary fractions: both clocks add them exactly): from copies well
# inside a step to ones that outlast several.
COPY_STEPS = st.sampled_from([0.25, 0.5, 1.0, 1.5, 4.0])


@peer
@pytest.mark.parametrize("copy_steps_per_block", [0.5, 2.0])
def test_the_hand_cases_with_slow_copies_are_vllms(copy_steps_per_block) -> None:  # type: ignore[no-untyped-def]
    for case in (_evicting_case(), _scan_case()):
        agrees_with_vllm(case, prefix_caching=True, num_cpu_blocks=20,
                         copy_steps_per_block=copy_steps_per_block)  # fmt: skip


@peer
def test_a_step_waiting_for_a_store_that_ends_within_it_is_not_stuck() -> None:
    # Request 0's 9 prompt blocks copy from the start of step 1 to a quarter into step 3;
    # request 2 would hit their first block, so step 3 schedules nothing and no copy is
    # pending after it; step 4 loads the block and step 5 runs request 2 (found in CI).
    shared = dict(prefix_group=0, prefix_tokens=4)
    requests = [Request(0, 0.0, 36, 1, **shared), Request(1, 0.0, 1, 1),  # type: ignore[arg-type]
                Request(2, 0.0, 4, 1, **shared), Request(3, 0.0, 1, 1)]  # type: ignore[arg-type]  # fmt: skip
    case = (requests, 4, 11, V1Limits(1, 36, 256), None)
    assert agrees_with_vllm(case, prefix_caching=True, num_cpu_blocks=9,
                            copy_steps_per_block=0.25) == 6  # fmt: skip


@peer
@settings(max_examples=60, deadline=None)
@given(case_and_tier=tiered_workloads(), copy_steps_per_block=COPY_STEPS)
def test_kvbench_v1_with_timed_copies_agrees_with_vllm_step_for_step(
    case_and_tier, copy_steps_per_block
) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1],
                     copy_steps_per_block=copy_steps_per_block)  # fmt: skip


@peer
@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(case_and_tier=tiered_workloads(), copy_steps_per_block=COPY_STEPS, policy=POLICIES)
def test_timed_copies_agree_with_vllm_on_a_thousand(
    case_and_tier, copy_steps_per_block, policy
) -> None:  # type: ignore[no-untyped-def]
    agrees_with_vllm(case_and_tier[0], prefix_caching=True, num_cpu_blocks=case_and_tier[1],
                     cpu_tier_policy=policy, copy_steps_per_block=copy_steps_per_block)  # fmt: skip
