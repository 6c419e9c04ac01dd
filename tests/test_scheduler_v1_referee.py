"""kvbench's model of vLLM v1's scheduler (``engine.scheduler_v1``) against the real one, step for
step: same requests, same limits, the same pool (``num_gpu_blocks`` with vLLM's null block), prefix
caching off. Every compared field of every step must be identical."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee_support import agrees_with_vllm, kvbench_v1_steps, peer

from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.request import Request
from kvbench.engine.scheduler_v1 import V1Limits
from kvbench.tools.async_gap import TRACES as TRACE_SLICES
from kvbench.tools.async_gap import trace_slice


def test_chunked_prefill_running_first_without_vllm() -> None:
    # The same case tests/test_referee.py pins on real vLLM.
    requests = [Request(0, 0.0, 300, 3), Request(1, 0.0, 100, 3)]
    steps = kvbench_v1_steps(requests, 16, 100, V1Limits(8, 128, 1024))
    assert [step.scheduled_tokens for step in steps[:4]] == [
        ((0, 128),), ((0, 128),), ((0, 44), (1, 84)), ((0, 1), (1, 16))
    ]
    assert [step.finished_request_ids for step in steps[4:]] == [(0,), (1,)]


def test_a_full_pool_preempts_the_last_running_request_without_vllm() -> None:
    requests = [Request(0, 0.0, 60, 20), Request(1, 0.0, 60, 20)]
    steps = kvbench_v1_steps(requests, 16, 10, V1Limits(8, 256, 1024))
    assert next(s.preempted_request_ids for s in steps if s.preempted_request_ids) == (1,)
    assert max(step.num_blocks_in_use for step in steps) <= 9


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], int, int, V1Limits, list[int] | None]:
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    requests = [
        Request(request_id, 0.0, draw(st.integers(1, 120)), draw(st.integers(1, 40)))
        for request_id in range(draw(st.integers(1, 10)))
    ]
    largest_blocks = max(-(-request.total_tokens // block_size) for request in requests)
    # From a pool that holds one request (preempting often) to one that never fills.
    num_gpu_blocks = largest_blocks + NUM_NULL_BLOCKS + draw(st.integers(0, 60))
    limits = V1Limits(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(8, 160)),  # vLLM: >= max_num_seqs
        max_model_len=256,
    )
    # All at once (a burst), or spread over the first steps.
    arrival_steps = draw(st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=len(requests),
                                                       max_size=len(requests))))  # fmt: skip
    return requests, block_size, num_gpu_blocks, limits, arrival_steps



@peer
@settings(max_examples=60, deadline=None)
@given(case=workloads())
def test_kvbench_v1_agrees_with_vllm_step_for_step(case) -> None:
    agrees_with_vllm(case, prefix_caching=False)


@peer
@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(case=workloads())
def test_kvbench_v1_agrees_with_vllm_step_for_step_on_thousands_of_workloads(case) -> None:
    agrees_with_vllm(case, prefix_caching=False)


# Slices of the shared traces: their real length mixes (ShareGPT first turns, multi-turn
# histories, Azure's production conversation hour with its arrival times, Mooncake's long prompts,
# arXiv summaries) on an 8K-context engine whose pool preempts.
# TRACE_SLICES are those python -m kvbench.tools.async_gap replays (its trace_slice: the first
# 80 requests of each that fit the context, arrivals at 20 steps per trace second, else a burst).
SLICE_LIMITS = V1Limits(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192)


@peer
@pytest.mark.parametrize("trace", TRACE_SLICES)
def test_kvbench_v1_agrees_with_vllm_on_trace_slices(shared_traces, trace) -> None:
    requests, arrivals = trace_slice(shared_traces / trace)
    # 1,200 blocks of 16: 19,184 slots, about 2.3 of the longest requests: the pool preempts.
    case = (requests, 16, 1200, SLICE_LIMITS, arrivals)
    num_steps = agrees_with_vllm(case, prefix_caching=False)
    assert num_steps > 80
