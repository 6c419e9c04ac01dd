"""The continuous-batching engine: hand-checkable cases, determinism, preemption, rejection."""

import dataclasses

import pytest

from kvbench.allocators import ALLOCATOR_NAMES, make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate

OPT13B = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
COSTS = RooflineCostModel(OPT13B)
MAX_LEN = 2048


def _requests(lengths, gap_s=0.01):
    return [
        Request(request_id=i, arrival_s=i * gap_s, prompt_tokens=p, output_tokens=o)
        for i, (p, o) in enumerate(lengths)
    ]


def _run(name, requests, num_slots=15_728, **limits):
    allocator = make_allocator(name, num_slots, 16, MAX_LEN)
    scheduler = Scheduler(SchedulerLimits(max_model_len=MAX_LEN, **limits))
    return simulate(requests, scheduler, allocator, COSTS)


def test_one_request_holds_ten_blocks_paged_and_2048_slots_naive_max():
    request = _requests([(100, 47)])
    paged = _run("paged", request).requests[0]
    naive = _run("naive_max", request).requests[0]
    assert paged.status == naive.status == "finished"
    assert paged.peak_slots == 160  # 147 tokens in 10 blocks of 16
    assert naive.peak_slots == 2048
    # Prefill produces the first token, then 46 decode iterations.
    assert len(_run("paged", request).steps) == 47


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_same_inputs_give_identical_records(name):
    requests = _requests([(50 + 7 * i % 300, 20 + 13 * i % 200) for i in range(60)], gap_s=0.003)
    first = _run(name, requests, num_slots=4096)
    second = _run(name, requests, num_slots=4096)
    assert first.steps.columns == second.steps.columns
    assert first.requests == second.requests


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_every_request_finishes_under_memory_pressure(name):
    # A pool of 4,096 slots for 80 requests of up to 1,000 tokens forces queueing and preemption.
    requests = _requests([(20 + 37 * i % 500, 10 + 53 * i % 480) for i in range(80)], gap_s=0)
    result = _run(name, requests, num_slots=4096)
    assert all(record.status == "finished" for record in result.requests)
    steps = result.steps.columns
    for i in range(len(result.steps)):
        total = sum(
            steps[f"{c}_slots"][i]
            for c in ("token_states", "reservation", "internal_frag", "external_frag", "free")
        )
        assert total == result.num_slots


def test_paged_preempts_the_latest_arrival_and_recomputes():
    # Two requests that each fit alone but not together at their final lengths.
    requests = _requests([(16, 200), (16, 200)], gap_s=0)
    result = _run("paged", requests, num_slots=320)
    first, second = result.requests
    assert first.num_preemptions == 0
    assert second.num_preemptions >= 1
    assert first.finish_s < second.finish_s
    assert all(record.status == "finished" for record in result.requests)


def test_swap_preemption_moves_kv_over_pcie():
    requests = _requests([(16, 200), (16, 200)], gap_s=0)
    recompute = _run("paged", requests, num_slots=320)
    swap = _run("paged", requests, num_slots=320, preemption="swap", swap_capacity_tokens=10_000)
    assert sum(r.num_swaps for r in swap.requests) >= 1
    assert sum(r.num_swaps for r in recompute.requests) == 0
    assert all(record.status == "finished" for record in swap.requests)


def test_too_long_and_too_large_requests_are_rejected_with_a_reason():
    requests = _requests([(2000, 100), (100, 10)])
    result = _run("paged", requests)
    assert result.requests[0].status == "rejected"
    assert result.requests[0].reject_reason == "exceeds_max_model_len"
    assert result.requests[1].status == "finished"
    # A pool smaller than the request: rejected, and the next request still runs.
    small = _run("paged", _requests([(600, 100), (100, 10)]), num_slots=512)
    assert small.requests[0].status == "rejected"
    assert small.requests[0].reject_reason == "exceeds_pool"
    assert small.requests[1].status == "finished"


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_every_unservable_request_is_recorded_with_its_reason(name, fast):
    lengths = [(0, 10), (MAX_LEN, 5), (10**18, 3), (MAX_LEN - 1, 5), (300, 10), (50, 20)]
    requests = _requests(lengths)
    allocator = make_allocator(name, 15_728, 16, MAX_LEN)
    limits = SchedulerLimits(max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN - 100)
    result = simulate(requests, Scheduler(limits), allocator, COSTS, fast=fast)
    by_id = {record.request_id: record for record in result.requests}
    assert len(by_id) == len(requests)  # none vanishes
    assert [by_id[i].reject_reason for i in range(len(requests))] == [
        "empty_prompt",
        "prompt_exceeds_max_model_len",
        "prompt_exceeds_max_model_len",
        "exceeds_max_model_len",
        "",
        "",
    ]
    assert [by_id[i].status for i in range(len(requests))] == ["rejected"] * 4 + ["finished"] * 2
    budget = _requests([(MAX_LEN - 50, 10)])
    assert simulate(budget, Scheduler(limits), make_allocator(name, 15_728, 16, MAX_LEN), COSTS,
                    fast=fast).requests[0].reject_reason == "prompt_exceeds_max_num_batched_tokens"


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_a_request_with_no_output_is_served_by_its_prefill_alone(name):
    # Its prefill runs (its prompt's KV is held for that iteration) and ends it.
    requests = _requests([(100, 0), (40, 3)], gap_s=0)
    slow = _run(name, requests)
    allocator = make_allocator(name, 15_728, 16, MAX_LEN)
    fast = simulate(requests, Scheduler(SchedulerLimits(max_model_len=MAX_LEN)), allocator, COSTS,
                    fast=True)
    assert slow.requests == fast.requests
    empty_output = slow.requests[0]
    assert empty_output.status == "finished"
    assert empty_output.finish_s == empty_output.first_token_s > empty_output.arrival_s


def test_batch_respects_max_num_seqs_and_token_budget():
    requests = _requests([(100, 50)] * 40, gap_s=0)
    result = _run("paged", requests, max_num_seqs=8, max_num_batched_tokens=250)
    assert max(result.steps.columns["batch_size"]) <= 8
    assert max(result.steps.columns["num_prefill_tokens"]) <= 250
    assert all(record.status == "finished" for record in result.requests)


def test_a_request_s_samples_take_their_seats_at_admission():
    # 4 seats: a request of 3 samples and two plain ones arrive together. As vLLM v0 counts a
    # sequence group's samples when it admits it, the first plain one joins the 3 and the
    # second waits (admitted one by one, the 3 samples forked beside both would make 5).
    requests = [Request(0, 0.0, 16, 5, num_samples=3), Request(1, 0.0, 16, 5),
                Request(2, 0.0, 16, 5)]  # fmt: skip
    result = _run("paged", requests, max_num_seqs=4)
    steps = result.steps.columns
    assert steps["num_prefill_seqs"][0] == 2 and max(steps["batch_size"]) == 4
    assert all(record.status == "finished" for record in result.requests)


def test_swapped_in_sequences_count_against_the_token_budget():
    # Two sequences wait swapped out and a 63-token prompt waits; the budget is 64. Both swap
    # back in and decode a token each, so the prompt no longer fits beside them (2 + 63 > 64).
    from kvbench.engine.records import RequestRecord
    from kvbench.engine.sequence import Sequence

    def sequence(seq_id, prompt_tokens, num_generated):
        request = Request(seq_id, 0.0, prompt_tokens, 10)
        record = RequestRecord(seq_id, 0.0, prompt_tokens, 10, 10)
        return Sequence(request=request, record=record, seq_id=seq_id, num_generated=num_generated)

    scheduler = Scheduler(SchedulerLimits(max_model_len=256, max_num_batched_tokens=64,
                                          preemption="swap", swap_capacity_tokens=1000))
    for swapped in (sequence(0, 8, 2), sequence(1, 8, 2)):  # as swap-out leaves them
        scheduler._swapped.append(swapped)
        scheduler.num_swapped_tokens += swapped.num_kv_tokens
    scheduler.add(sequence(2, 63, 0))
    batch, _ = scheduler.schedule(make_allocator("paged", 1024, 16, 256))
    assert len(batch.swapped_in) == 2 and not batch.prefill


def test_a_sequence_preempted_past_the_token_budget_is_an_error_not_a_hang():
    # Recomputed whole, 16 + up to 200 tokens cannot fit a budget of 100: vLLM v0 refuses a
    # budget under max_model_len (so does kvbench's config); the engine says so.
    requests = _requests([(16, 200)] * 2, gap_s=0)
    with pytest.raises(ValueError, match=r"preempted holding \d+ tokens, more than "
                                         r"max_num_batched_tokens=100 can recompute"):  # fmt: skip
        _run("paged", requests, num_slots=320, max_num_batched_tokens=100)


@pytest.mark.parametrize("fast", [True, False])
def test_a_swapped_sequence_that_can_never_come_back_is_rejected_not_a_hang(fast):
    # paged_hybrid with one full and one 8-token sliding group, padded to two layers: 40 blocks
    # of 4 tokens. Request 1 is swapped out near 80 tokens; swapping it back takes blocks for
    # every token in both groups (42 or more), where it held the window's in the sliding one.
    # Once request 0 finishes nothing else holds memory: it is rejected, not waited for forever.
    from kvbench.allocators import PagedHybridAllocator
    from kvbench.core.kv_groups import KvCacheGroup, KvGroupLayout
    from kvbench.engine.records import EXCEEDS_POOL

    layout = KvGroupLayout((KvCacheGroup(None, 1), KvCacheGroup(8, 1)), group_size=2,
                           num_model_layers=2)  # fmt: skip
    allocator = PagedHybridAllocator(160, 4, 512, layout=layout, num_blocks=40,
                                     generated_slot_ahead=True)  # fmt: skip
    limits = SchedulerLimits(max_model_len=512, preemption="swap", swap_capacity_tokens=1000)
    result = simulate([Request(0, 0.0, 8, 100), Request(1, 0.01, 60, 90)], Scheduler(limits),
                      allocator, RooflineCostModel(OPT13B), fast=fast)  # fmt: skip
    first, second = result.requests
    assert (first.status, first.num_swaps) == ("finished", 0)
    assert (second.status, second.reject_reason, second.num_swaps) == (
        "rejected", EXCEEDS_POOL, 1)


def test_naive_max_fits_seven_opt13b_requests():
    requests = _requests([(10, 500)] * 20, gap_s=0)
    result = _run("naive_max", requests)
    assert max(result.steps.columns["batch_size"]) == 7


def test_decode_is_memory_bound_and_prefill_compute_bound():
    from kvbench.engine import IterationShape

    model = OPT13B.model
    decode = IterationShape(0, 0, num_decode_tokens=1, decode_context_tokens=100)
    weights_s = model.weight_bytes / (1555e9 * 0.8)
    assert COSTS.iteration_time_s(decode) == pytest.approx(weights_s + 0.002, rel=0.01)
    prefill = IterationShape(2000, 2000 * 2001 // 2, 0, 0)
    flops_s = 2 * model.num_parameters * 2000 / (312e12 * 0.6)
    assert COSTS.iteration_time_s(prefill) > flops_s
    wider = dataclasses.replace(OPT13B, num_gpus=2)
    assert RooflineCostModel(wider).iteration_time_s(prefill) < COSTS.iteration_time_s(prefill)


def test_measured_attention_replaces_the_roofline_decode_attention():
    from kvbench.engine import IterationShape

    measured = RooflineCostModel(OPT13B, attention_time_s=lambda s: 1e-4 * s.num_decode_tokens)
    shape = IterationShape(300, 300 * 301 // 2, 8, 10_000)
    no_decode_attention = IterationShape(300, 300 * 301 // 2, 8, 0)
    assert measured.iteration_time_s(shape) == COSTS.iteration_time_s(no_decode_attention) + 8e-4
    decode = IterationShape(0, 0, 8, 10_000)
    assert measured.decode_time_fn(8)(10_000) == measured.iteration_time_s(decode)


def _wake_model():  # type: ignore[no-untyped-def]
    from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel

    costs = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0)
    costs |= {"fixed_s": 0.01, "per_token_s": 1e-3, "wake_per_sqrt_idle_s": 0.05,
              "wake_per_idle_s": 0.1}
    return ProfiledCostModel(costs, 16)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("scheduler", ["v0", "vllm_v1"])
def test_the_first_iteration_after_an_idle_wait_pays_the_wake_up(fast, scheduler):
    from kvbench.engine.scheduler_v1 import V1Limits
    from kvbench.engine.simulate_v1 import simulate_v1
    from kvbench.tasks.simulate.experiment import v1_memory

    # Request 0 waits 2 s from the start, request 1 arrives while it runs (no wait), request 2
    # after both have ended.
    requests = [Request(0, 2.0, 20, 3), Request(1, 2.05, 20, 2), Request(2, 4.0, 20, 2)]
    model = _wake_model()
    allocator = make_allocator("paged", 16 * 64, 16, 256)
    if scheduler == "v0":
        result = simulate(requests, Scheduler(SchedulerLimits(max_model_len=256)), allocator,
                          model, fast=fast)  # fmt: skip
    else:
        limits = V1Limits(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
        result = simulate_v1(requests, v1_memory("paged", allocator, limits), limits, model,
                             16 * 64, fast=fast)  # fmt: skip
    starts = list(result.steps.columns["time_s"])
    durations = list(result.steps.columns["duration_s"])
    # A 20-token prefill costs 0.03 s by its shape; a step of one or two decodes 0.011 / 0.012.
    assert starts[0] == 2.0
    assert durations[0] == pytest.approx(0.03 + 0.05 * 2.0**0.5 + 0.1 * 2.0)
    last = starts.index(4.0)  # request 2's prefill
    wait_s = 4.0 - (starts[last - 1] + durations[last - 1])
    assert wait_s > 1.0
    assert durations[last] == pytest.approx(0.03 + 0.05 * wait_s**0.5 + 0.1 * wait_s)
    # Every other step (request 1's prefill beside request 0's decode included) is its shape's.
    assert [i for i, duration in enumerate(durations) if duration > 0.05] == [0, last]
