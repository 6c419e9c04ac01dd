"""``scheduler=vllm_v1`` with async scheduling (vLLM's default on a GPU): step N is scheduled
before step N-1's tokens are taken in. Pinned cases (each checked against real vLLM's
``AsyncScheduler`` under the peer tests below), the clock, the config, and real vLLM step for
step on random workloads and trace slices."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee_support import agrees_with_vllm, kvbench_v1_steps, peer
from test_configs import _compose
from test_scheduler_v1_prefix_referee import workloads as prefix_workloads
from test_scheduler_v1_referee import SLICE_LIMITS, TRACE_SLICES, workloads

from kvbench.allocators import make_allocator
from kvbench.config import ConfigError, validate_config
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel
from kvbench.engine.scheduler_v1 import V1Limits, run_v1_steps
from kvbench.engine.simulate_v1 import simulate_v1
from kvbench.tasks.simulate.experiment import v1_memory
from kvbench.tools.async_gap import trace_slice

ONE_SEAT = V1Limits(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=256)
# Three usable blocks of 4 tokens (vLLM's null block is the fourth).
TIGHT = ((Request(0, 0.0, 1, 1), Request(1, 0.0, 4, 2), Request(2, 0.0, 1, 1)), 4, 4)


def _async(limits: V1Limits) -> V1Limits:
    return dataclasses.replace(limits, async_scheduling=True)


def _agrees_async(case, *, prefix_caching: bool = False) -> int:  # type: ignore[no-untyped-def]
    """``agrees_with_vllm`` on ``case`` (requests, block size, vLLM's blocks, limits, arrival
    steps) with its limits made asynchronous, for both engines."""
    requests, block_size, num_gpu_blocks, limits, arrival_steps = case
    return agrees_with_vllm((list(requests), block_size, num_gpu_blocks, _async(limits),
                             arrival_steps), prefix_caching=prefix_caching)  # fmt: skip


def test_a_finishing_request_holds_its_seat_one_step_longer() -> None:
    requests = [Request(0, 0.0, 20, 3), Request(1, 0.0, 20, 3)]
    sync = kvbench_v1_steps(requests, 16, 20, ONE_SEAT)
    lagged = kvbench_v1_steps(requests, 16, 20, _async(ONE_SEAT))
    assert [step.scheduled_tokens for step in sync] == [
        ((0, 20),), ((0, 1),), ((0, 1),), ((1, 20),), ((1, 1),), ((1, 1),)
    ]
    assert [step.finished_request_ids for step in sync] == [(), (), (0,), (), (), (1,)]
    # Async: request 0's last token (sampled in step 2) is in flight while step 3 is scheduled,
    # so it is not scheduled again, holds the only seat, and is taken in at the end of step 3.
    assert [step.scheduled_tokens for step in lagged] == [
        ((0, 20),), ((0, 1),), ((0, 1),), (), ((1, 20),), ((1, 1),), ((1, 1),), ()
    ]
    assert [step.finished_request_ids for step in lagged] == [(), (), (), (0,), (), (), (), (1,)]
    assert [step.num_running for step in lagged] == [1, 1, 1, 0, 1, 1, 1, 0]


def test_a_request_preempted_with_its_last_token_in_flight_still_finishes() -> None:
    requests, block_size, num_gpu_blocks = TIGHT
    steps = kvbench_v1_steps(list(requests), block_size, num_gpu_blocks,
                             _async(V1Limits(4, 64, 256)))  # fmt: skip
    # Step 1: request 1's first decode needs a second block; the pool is full, so the last
    # running request (2, its only token in flight) is preempted, and that token, taken in at
    # the end of the step, finishes it from the waiting queue.
    assert [step.scheduled_tokens for step in steps] == [((0, 1), (1, 4), (2, 1)), ((1, 1),), ()]
    assert [step.preempted_request_ids for step in steps] == [(), (2,), ()]
    assert [step.finished_request_ids for step in steps] == [(), (0, 2), (1,)]
    assert [(step.num_running, step.num_waiting) for step in steps] == [(3, 0), (1, 0), (0, 0)]


# Blocks of one token, 35 usable: request 3 is preempted in step 11 and resumes in step 14.
CATCH_UP = ((Request(0, 0.0, 1, 13), Request(1, 0.0, 2, 16), Request(2, 0.0, 1, 1),
             Request(3, 0.0, 1, 12)), 1, 36, V1Limits(4, 130, 256))  # fmt: skip


def test_a_taken_in_token_caches_the_block_it_fills_before_its_request_frees_it() -> None:
    requests, block_size, num_gpu_blocks, limits = CATCH_UP
    steps = kvbench_v1_steps(list(requests), block_size, num_gpu_blocks, _async(limits),
                             prefix_caching=True)  # fmt: skip
    assert steps[11].preempted_request_ids == (3,)
    assert steps[13].finished_request_ids == (0,)
    # Request 0's last block is cached when its last token is taken in, just before it is freed:
    # it joins the free queue's back (kept for reuse) instead of its front, so step 14 takes one
    # of request 3's cached blocks from the front: request 3 resumes with 6 of its 12 tokens
    # cached, not 7 (real vLLM's answer, test_the_pinned_cases_are_real_vllms).
    assert steps[14].scheduled_tokens == ((1, 1), (3, 6))
    assert (steps[14].resumed_query_tokens, steps[14].resumed_hit_tokens) == (12, 6)


def test_the_fast_path_gives_the_reference_steps() -> None:
    requests = [Request(i, 0.0, 17 + 13 * i, 5 + 7 * i) for i in range(12)]
    limits = _async(V1Limits(6, 96, 1024))
    fast, reference = (
        run_v1_steps(requests, v1_memory("paged_prefix", make_allocator("paged_prefix", 16 * 30,
                                                                        16, 1024), limits),
                     limits, fast=fast)
        for fast in (True, False)
    )  # fmt: skip
    assert any(step.preempted_request_ids for step in fast)  # the pool preempts
    assert fast == reference


def _simulate(requests: list[Request], limits: V1Limits):  # type: ignore[no-untyped-def]
    from kvbench.core.catalog import get_deployment

    deployment = get_deployment("opt-13b", "a100-40gb")
    allocator = make_allocator("paged", 16 * 99, 16, limits.max_model_len)
    return simulate_v1(requests, v1_memory("paged", allocator, limits), limits,
                       RooflineCostModel(deployment), 16 * 99)  # fmt: skip


def test_on_the_clock_tokens_come_out_when_sampled_and_a_freed_seat_is_taken_a_step_later() -> None:
    limits = V1Limits(max_num_seqs=2, max_num_batched_tokens=128, max_model_len=1024)
    requests = [Request(0, 0.0, 40, 3), Request(1, 0.0, 40, 8), Request(2, 0.0, 40, 3)]
    sync, lagged = _simulate(requests, limits), _simulate(requests, _async(limits))
    # Request 0 runs the same three steps either way: the same first and last token times.
    assert (lagged.requests[0].first_token_s, lagged.requests[0].finish_s) == pytest.approx(
        (sync.requests[0].first_token_s, sync.requests[0].finish_s)
    )
    # Request 2 waits for request 0's seat: async, one more step (request 1's decode alone)
    # runs before it is admitted.
    sync_times = list(sync.steps.columns["time_s"])
    lagged_times = list(lagged.steps.columns["time_s"])
    assert sync_times.index(sync.requests[2].admit_s) == 3
    assert lagged_times.index(lagged.requests[2].admit_s) == 4
    assert lagged.requests[2].first_token_s > sync.requests[2].first_token_s
    # Request 1's last token, sampled in the last row, is taken in by a step that runs nothing:
    # it writes no row and takes no time.
    assert len(lagged_times) == len(sync_times) == 8
    last_end_s = lagged_times[-1] + lagged.steps.columns["duration_s"][-1]
    assert lagged.requests[1].finish_s == pytest.approx(last_end_s)


def test_an_uncontended_run_is_the_same_either_way() -> None:
    limits = V1Limits(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
    requests = [Request(i, 0.1 * i, 30 + 7 * i, 4 + i) for i in range(6)]
    sync, lagged = _simulate(requests, limits), _simulate(requests, _async(limits))
    for ours, theirs in zip(lagged.requests, sync.requests, strict=True):
        assert (ours.admit_s, ours.first_token_s, ours.finish_s) == pytest.approx(
            (theirs.admit_s, theirs.first_token_s, theirs.finish_s)
        )


def test_the_config_turns_it_on_for_vllm_v1_and_refuses_it_for_vllm_v0() -> None:
    typed, _ = validate_config(_compose("scheduler=vllm_v1", "scheduler.async_scheduling=true"))
    assert typed.scheduler.async_scheduling is True
    with pytest.raises(ConfigError, match="async_scheduling=true under scheduler=vllm_v0"):
        validate_config(_compose("scheduler=vllm_v0", "scheduler.async_scheduling=true"))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_experiment_runs_it_as_configured(tmp_path, monkeypatch, async_scheduling: bool) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd
    from conftest import compose_config

    from kvbench.tasks.simulate import experiment

    engines = []

    def recording_simulate_v1(requests, memory, limits, *args, **kwargs):  # type: ignore[no-untyped-def]
        engines.append(limits)
        return simulate_v1(requests, memory, limits, *args, **kwargs)

    monkeypatch.setattr(experiment, "simulate_v1", recording_simulate_v1)
    cfg, deployment, raw = compose_config(
        "scheduler=vllm_v1", f"scheduler.async_scheduling={str(async_scheduling).lower()}",
        "scheduler.max_num_seqs=2", "workload=fixed", "workload.num_requests=6",
        "workload.prompt_tokens=100", "workload.output_tokens=5", "model=opt-13b",
        "hardware=a100-40gb", "allocators=[paged]", "progress=false", "plots=false",
        "summary_table=false",
    )  # fmt: skip
    experiment.run_experiment(cfg, deployment, raw, tmp_path)
    assert [limits.async_scheduling for limits in engines] == [async_scheduling]
    assert (pd.read_parquet(tmp_path / "requests.parquet")["status"] == "finished").all()


@peer
def test_the_pinned_cases_are_real_vllms() -> None:
    _agrees_async((*TIGHT, V1Limits(4, 64, 256), None))
    _agrees_async(([Request(0, 0.0, 20, 3), Request(1, 0.0, 20, 3)], 16, 20, ONE_SEAT, None))
    _agrees_async((*CATCH_UP, None), prefix_caching=True)


def _agrees_on_a_drawn_workload(data: st.DataObject, prefix_caching: bool) -> None:
    case = data.draw(prefix_workloads() if prefix_caching else workloads())
    _agrees_async(case, prefix_caching=prefix_caching)


@peer
@pytest.mark.parametrize("prefix_caching", [False, True])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_async_agrees_with_vllm_step_for_step(prefix_caching: bool, data: st.DataObject) -> None:
    _agrees_on_a_drawn_workload(data, prefix_caching)


@peer
@pytest.mark.slow
@pytest.mark.parametrize("prefix_caching", [False, True])
@settings(max_examples=1000, deadline=None)
@given(data=st.data())
def test_async_agrees_with_vllm_on_a_thousand_workloads(
    prefix_caching: bool, data: st.DataObject
) -> None:
    _agrees_on_a_drawn_workload(data, prefix_caching)


@peer
@pytest.mark.parametrize("trace", TRACE_SLICES)
def test_async_agrees_with_vllm_on_trace_slices(shared_traces, trace) -> None:
    requests, arrivals = trace_slice(shared_traces / trace)
    assert _agrees_async((requests, 16, 1200, SLICE_LIMITS, arrivals)) > 80
