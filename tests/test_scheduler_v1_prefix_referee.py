"""kvbench's model of vLLM v1 with prefix caching (``paged_prefix`` under ``engine.scheduler_v1``)
against the real scheduler, step for step: same requests (their prefix identity turned into token
ids by ``referee.token_ids``), same limits, pools small enough to preempt and to evict. Every
compared field of every step, prefix-cache query and hit tokens (new and resumed) included, must
be identical."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee_support import agrees_with_vllm, kvbench_v1_steps, peer

from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.request import Request
from kvbench.engine.scheduler_v1 import V1Limits

Case = tuple[list[Request], int, int, V1Limits, "list[int] | None"]



def test_a_later_request_of_the_same_step_hits_blocks_cached_at_allocation() -> None:
    # The case tests/test_referee.py pins on real vLLM: 2 x 16 of the shared 40 tokens hit.
    shared = dict(prefix_group=5, prefix_tokens=40)
    requests = [Request(0, 0.0, 50, 3, **shared), Request(1, 0.0, 50, 3, **shared)]
    steps = kvbench_v1_steps(requests, 16, 100, V1Limits(8, 512, 1024), prefix_caching=True)
    assert steps[0].scheduled_tokens == ((0, 50), (1, 18))
    assert (steps[0].prefix_query_tokens, steps[0].prefix_hit_tokens) == (100, 32)


def test_a_full_prompt_hit_still_recomputes_its_last_token() -> None:
    shared = dict(prefix_group=1, prefix_tokens=32)
    requests = [Request(0, 0.0, 32, 2, **shared), Request(1, 0.0, 32, 2, **shared)]
    steps = kvbench_v1_steps(requests, 16, 100, V1Limits(8, 512, 1024), [0, 5],
                             prefix_caching=True)
    admitted = next(step for step in steps if step.step_index == 5)
    # 32 tokens cached, but at most 31 may hit: one whole block, the second recomputed.
    assert (admitted.prefix_query_tokens, admitted.prefix_hit_tokens) == (32, 16)
    assert admitted.scheduled_tokens == ((1, 16),)


def test_a_resumed_request_hits_its_own_blocks_and_is_counted_apart() -> None:
    requests = [Request(0, 0.0, 60, 30), Request(1, 0.0, 60, 30)]
    steps = kvbench_v1_steps(requests, 16, 10, V1Limits(8, 256, 1024), prefix_caching=True)
    assert any(step.preempted_request_ids for step in steps)
    resumed = [step for step in steps if step.resumed_query_tokens]
    assert resumed and sum(step.resumed_hit_tokens for step in resumed) > 0
    assert sum(step.prefix_query_tokens for step in steps) == 120  # each first admission once


@st.composite
def workloads(draw: st.DrawFn) -> Case:
    """Requests sharing prefixes (a few groups, or Mooncake-like hash ids) on small pools."""
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    hash_block_tokens = draw(st.sampled_from([4, 8, 16]))
    requests = []
    for request_id in range(draw(st.integers(1, 12))):
        prompt_tokens = draw(st.integers(1, 120))
        kind = draw(st.sampled_from(["own", "group", "hashes"]))
        identity: dict[str, object] = {}
        if kind == "group":
            identity = dict(prefix_group=draw(st.integers(0, 2)),
                            prefix_tokens=draw(st.integers(0, 120)))  # fmt: skip
        elif kind == "hashes":
            num_hashes = draw(st.integers(1, -(-prompt_tokens // hash_block_tokens)))
            # A short alphabet of chains: prompts share leading hash blocks, or diverge.
            trunk = draw(st.integers(0, 2))
            split = draw(st.integers(0, num_hashes))
            hashes = [trunk * 100 + i for i in range(split)]
            hashes += [1000 * (request_id + 1) + i for i in range(split, num_hashes)]
            identity = dict(prefix_block_hashes=tuple(hashes),
                            hash_block_tokens=hash_block_tokens)  # fmt: skip
        output_tokens = draw(st.integers(1, 40))
        requests.append(Request(request_id, 0.0, prompt_tokens, output_tokens, **identity))
    largest_blocks = max(-(-request.total_tokens // block_size) for request in requests)
    num_gpu_blocks = largest_blocks + NUM_NULL_BLOCKS + draw(st.integers(0, 60))
    limits = V1Limits(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(8, 160)),
        max_model_len=256,
    )
    arrival_steps = draw(st.one_of(st.none(), st.lists(st.integers(0, 30), min_size=len(requests),
                                                       max_size=len(requests))))  # fmt: skip
    return requests, block_size, num_gpu_blocks, limits, arrival_steps



@peer
@settings(max_examples=40, deadline=None)
@given(case=workloads())
def test_kvbench_v1_with_prefix_caching_agrees_with_vllm_step_for_step(case: Case) -> None:
    agrees_with_vllm(case, prefix_caching=True)


@peer
@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(case=workloads())
def test_kvbench_v1_with_prefix_caching_agrees_with_vllm_on_thousands(case: Case) -> None:
    agrees_with_vllm(case, prefix_caching=True)


# Slices of the shared traces with prefix caching on: ShareGPT first turns and multi-turn histories
# (no prefix identity in these files: hits come from resumed requests, and, with a shared system
# prompt of 200 tokens given to every request as the system_prompt_sharing experiment does, from
# one another), Azure's conversation hour at its arrival times, and Mooncake with its hash_ids
# (its real prefix structure replayed).
PREFIX_TRACE_SLICES = [
    ("sharegpt/sharegpt_val_10k_llama2.csv", 0),
    ("sharegpt/sharegpt_val_10k_llama2.csv", 200),
    ("sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 0),
    ("azure2023/AzureLLMInferenceTrace_conv.csv", 0),
    ("mooncake/conversation_trace.jsonl", 0),
]
SLICE_LIMITS = V1Limits(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192)
STEPS_PER_S = 20  # the referee has no clock: a trace second is this many steps


def trace_slice(
    trace_path, system_prompt_tokens: int = 0, num_requests: int = 80
) -> tuple[list[Request], list[int] | None]:  # type: ignore[no-untyped-def]
    """The first ``num_requests`` requests of a trace that fit the slice's engine, ids 0..n-1
    (sharing a system prompt of ``system_prompt_tokens`` when > 0), with their arrival steps
    (None: a burst)."""
    from kvbench.workloads import load_trace, to_requests

    frame = load_trace(trace_path).head(5 * num_requests)
    fits = (frame["prompt_tokens"] >= 1) & (frame["output_tokens"] >= 1)
    fits &= frame["prompt_tokens"] + frame["output_tokens"] <= SLICE_LIMITS.max_model_len
    frame = frame[fits].head(num_requests)
    timed = not frame["arrival_s"].isna().any()
    if not timed:
        frame = frame.assign(arrival_s=0.0)
    shared = {}
    if system_prompt_tokens:
        shared = dict(prefix_group=0, prefix_tokens=system_prompt_tokens)
    requests = [
        dataclasses.replace(request, request_id=index, **shared)  # type: ignore[arg-type]
        for index, request in enumerate(to_requests(frame))
    ]
    if not timed:
        return requests, None
    first_s = min(request.arrival_s for request in requests)
    return requests, [int((r.arrival_s - first_s) * STEPS_PER_S) for r in requests]


@peer
@pytest.mark.parametrize(("trace", "system_prompt_tokens"), PREFIX_TRACE_SLICES)
def test_kvbench_v1_with_prefix_caching_agrees_with_vllm_on_trace_slices(
    shared_traces, trace, system_prompt_tokens
) -> None:  # type: ignore[no-untyped-def]
    requests, arrivals = trace_slice(shared_traces / trace, system_prompt_tokens)
    # 1,200 blocks of 16: the pool preempts and evicts cached blocks.
    case = (requests, 16, 1200, SLICE_LIMITS, arrivals)
    num_steps = agrees_with_vllm(case, prefix_caching=True)
    assert num_steps > 80
