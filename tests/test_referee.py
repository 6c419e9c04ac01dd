"""The referee: real vLLM v1's scheduler driven step by step on kvbench requests.

Without vLLM only the error path runs; the ``peer`` tests check the driver's records against
what the limits and the requests force on any correct scheduler, and pin the vLLM behaviours
kvbench's v1 model must reproduce (same-step prefix hits, preemption of the last running request).
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from referee_support import peer

from kvbench.core.request import Request
from kvbench.referee import vllm_v1
from kvbench.referee.vllm_v1 import (
    RefereeConfigError,
    RefereeLimits,
    RefereeStep,
    RefereeUnavailable,
    run_referee,
)


def _limits(**changes: int | bool) -> RefereeLimits:
    values: dict = dict(block_size=16, num_gpu_blocks=100, max_num_seqs=8,
                        max_num_batched_tokens=256, max_model_len=1024,
                        enable_prefix_caching=True)  # fmt: skip
    values.update(changes)
    return RefereeLimits(**values)


def test_without_vllm_the_referee_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    vllm_v1._import_vllm.cache_clear()
    try:
        with pytest.raises(RefereeUnavailable) as error:
            run_referee([Request(0, 0.0, 10, 2)], _limits())
    finally:
        vllm_v1._import_vllm.cache_clear()
    line = str(error.value)
    assert "\n" not in line
    assert "pip install --no-deps -r requirements/referee.txt" in line


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (Request(0, 0.0, 0, 5), "needs >= 1 prompt and >= 1 output token"),
        (Request(0, 0.0, 5, 0), "needs >= 1 prompt and >= 1 output token"),
        (Request(0, 0.0, 1000, 100), "exceed max_model_len=1024"),
    ],
)
def test_requests_vllm_cannot_serve_are_refused_before_it_runs(request_, expected) -> None:
    with pytest.raises(ValueError, match=expected):
        run_referee([request_], _limits())


def _tokens_of(steps: list[RefereeStep], request_id: int) -> list[int]:
    return [dict(step.scheduled_tokens).get(request_id, 0) for step in steps]


@peer
def test_chunked_prefill_fills_the_budget_running_requests_first() -> None:
    requests = [Request(0, 0.0, 300, 3), Request(1, 0.0, 100, 3)]
    steps = run_referee(requests, _limits(max_num_batched_tokens=128))
    # 300 prompt tokens in chunks of the budget; the second request takes what is left.
    assert steps[0].scheduled_tokens == ((0, 128),)
    assert steps[1].scheduled_tokens == ((0, 128),)
    assert steps[2].scheduled_tokens == ((0, 44), (1, 84))
    assert steps[3].scheduled_tokens == ((0, 1), (1, 16))
    # One sampled token per step once a prompt is complete, none mid-prefill.
    assert [step.finished_request_ids for step in steps[4:]] == [(0,), (1,)]
    assert sum(_tokens_of(steps, 0)) == 300 + 3 - 1


@peer
def test_blocks_are_cached_as_allocated_so_a_request_in_the_same_step_hits_them() -> None:
    shared = dict(prefix_group=5, prefix_tokens=40)
    requests = [Request(0, 0.0, 50, 2, **shared), Request(1, 0.0, 50, 2, **shared)]
    steps = run_referee(requests, _limits())
    assert steps[0].prefix_query_tokens == 100
    assert steps[0].prefix_hit_tokens == 32  # the second request: two whole shared blocks
    assert steps[0].scheduled_tokens == ((0, 50), (1, 18))
    off = run_referee(requests, _limits(enable_prefix_caching=False))
    assert off[0].prefix_hit_tokens == 0
    assert off[0].scheduled_tokens == ((0, 50), (1, 50))


@peer
def test_a_full_pool_preempts_the_last_running_request_and_recomputes_it() -> None:
    # 9 usable blocks of 16: both 60-token prompts fit (4 blocks each) but cannot both grow to 80.
    requests = [Request(0, 0.0, 60, 20), Request(1, 0.0, 60, 20)]
    steps = run_referee(requests, _limits(num_gpu_blocks=10, enable_prefix_caching=False))
    preempted = [step.preempted_request_ids for step in steps if step.preempted_request_ids]
    assert preempted[0] == (1,)
    assert all(step.num_blocks_in_use <= 9 for step in steps)
    first_preemption = next(i for i, step in enumerate(steps) if step.preempted_request_ids)
    resumed_tokens = next(
        tokens for tokens in _tokens_of(steps, 1)[first_preemption + 1 :] if tokens
    )
    assert resumed_tokens > 1  # recompute: the prompt and the tokens it had, again


@peer
def test_a_waiting_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    # 9 usable blocks: the first 80-token prompt takes 5; the second's first chunk (20 tokens)
    # would fit in the 4 left, its whole prompt (5 blocks) would not: vLLM 0.32 waits.
    requests = [Request(0, 0.0, 80, 40), Request(1, 0.0, 80, 5)]
    steps = run_referee(
        requests, _limits(num_gpu_blocks=10, max_num_batched_tokens=100,
                          enable_prefix_caching=False),
    )  # fmt: skip
    assert steps[0].scheduled_tokens == ((0, 80),)
    first_step_of_1 = next(i for i, step in enumerate(steps) if 1 in dict(step.scheduled_tokens))
    assert 0 in steps[first_step_of_1 - 1].finished_request_ids


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Request], RefereeLimits]:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    requests = []
    for request_id in range(draw(st.integers(1, 8))):
        group = draw(st.sampled_from([None, 0, 1]))
        requests.append(Request(request_id, 0.0, draw(st.integers(1, 100)),
                                draw(st.integers(1, 30)), prefix_group=group,
                                prefix_tokens=draw(st.integers(0, 80))))  # fmt: skip
    largest_blocks = max(-(-request.total_tokens // block_size) for request in requests)
    limits = RefereeLimits(
        block_size=block_size,
        # From a pool that holds one request (and preempts often) to one that never preempts.
        num_gpu_blocks=largest_blocks + 1 + draw(st.integers(0, 40)),
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(8, 128)),
        max_model_len=256,
        enable_prefix_caching=draw(st.booleans()),
    )
    return requests, limits


@peer
@settings(max_examples=40, deadline=None)
@given(case=workloads())
def test_every_step_respects_the_limits_and_every_request_finishes_once(case) -> None:
    requests, limits = case
    steps = run_referee(requests, limits)
    for step in steps:
        assert sum(tokens for _, tokens in step.scheduled_tokens) <= limits.max_num_batched_tokens
        assert len(step.scheduled_tokens) <= limits.max_num_seqs
        assert 0 <= step.num_blocks_in_use <= limits.num_gpu_blocks - 1  # the null block
        assert step.prefix_hit_tokens % limits.block_size == 0  # hits in whole blocks
        assert step.prefix_hit_tokens <= step.prefix_query_tokens
        assert step.resumed_hit_tokens <= step.resumed_query_tokens
        if not limits.enable_prefix_caching:
            assert step.prefix_hit_tokens == step.resumed_hit_tokens == 0
    finished = sorted(i for step in steps for i in step.finished_request_ids)
    assert finished == [request.request_id for request in requests]
    assert steps[-1].num_running == steps[-1].num_waiting == 0
    if not any(step.preempted_request_ids for step in steps):
        # Each request computes its prompt and all outputs but the last, less its cache hits.
        computed = sum(tokens for step in steps for _, tokens in step.scheduled_tokens)
        hits = sum(step.prefix_hit_tokens for step in steps)
        assert computed + hits == sum(r.prompt_tokens + r.output_tokens - 1 for r in requests)


@peer
def test_arrival_steps_hold_requests_back_until_their_step() -> None:
    requests = [Request(0, 0.0, 10, 5), Request(1, 0.0, 10, 5)]
    steps = run_referee(requests, _limits(), arrival_steps=[0, 3])
    assert [ids for ids, _ in steps[2].scheduled_tokens] == [0]
    assert dict(steps[3].scheduled_tokens)[1] == 10


@peer
def test_the_effective_config_is_checked_against_the_limits() -> None:
    limits = _limits()
    config = vllm_v1.vllm_config(limits)
    vllm_v1._check_effective_config(config, limits)  # as asked: no error
    config.cache_config.block_size = 128  # what the CPU platform picks when none is given
    with pytest.raises(RefereeConfigError, match="block_size=128 where 16 was asked"):
        vllm_v1._check_effective_config(config, limits)
    config = vllm_v1.vllm_config(limits)
    config.scheduler_config.async_scheduling = True
    with pytest.raises(RefereeConfigError, match="async_scheduling"):
        vllm_v1._check_effective_config(config, limits)


@peer
def test_limits_vllm_refuses_are_one_line_errors() -> None:
    with pytest.raises(RefereeConfigError) as error:
        run_referee([Request(0, 0.0, 10, 2)], _limits(max_num_seqs=8, max_num_batched_tokens=4))
    assert "\n" not in str(error.value)
    assert "must be greater than or equal to max_num_seqs" in str(error.value)


@peer
def test_a_pool_too_small_for_any_waiting_request_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="raise num_gpu_blocks"):
        run_referee([Request(0, 0.0, 100, 5)], _limits(num_gpu_blocks=3))


@peer
def test_async_scheduling_frees_a_finished_request_one_step_later() -> None:
    # 10 usable blocks of 16, all at once: A (60 + 4), B (10 + 30), C (100 + 3). C needs A's
    # blocks: synchronous vLLM admits it in the step after A's last token (step 4); async vLLM
    # schedules that step before taking A's last token in, so C waits one more.
    requests = [Request(0, 0.0, 60, 4), Request(1, 0.0, 10, 30), Request(2, 0.0, 100, 3)]
    limits = _limits(num_gpu_blocks=11, enable_prefix_caching=False)
    sync = run_referee(requests, limits)
    lagged = run_referee(requests, _limits(num_gpu_blocks=11, enable_prefix_caching=False,
                                           async_scheduling=True))  # fmt: skip
    assert [step.finished_request_ids for step in sync[3:5]] == [(0,), ()]
    assert sync[4].scheduled_tokens == ((1, 1), (2, 100))
    assert [step.finished_request_ids for step in lagged[3:5]] == [(), (0,)]
    assert lagged[4].scheduled_tokens == ((1, 1),)  # A's blocks still held while it schedules
    assert lagged[5].scheduled_tokens == ((1, 1), (2, 100))
    # Every request still produces all its tokens, and the async run takes one step more.
    assert len(lagged) == len(sync) + 1
    for steps in (sync, lagged):
        tokens = {rid: 0 for rid in range(3)}
        for step in steps:
            for rid, num_tokens in step.scheduled_tokens:
                tokens[rid] += num_tokens
        assert tokens == {0: 63, 1: 39, 2: 102}  # the last token is sampled, never computed


def test_async_gap_reads_each_request_s_first_and_last_step() -> None:
    from kvbench.tools.async_gap import request_steps

    def step(index: int, scheduled: tuple) -> RefereeStep:
        return RefereeStep(index, scheduled, 0, (), (), 0, 0, 0, 0, 0, 0)

    steps = [step(0, ((0, 60),)), step(1, ((0, 1), (1, 10))), step(2, ()), step(3, ((1, 1),))]
    assert request_steps(steps, 3) == [(0, 1), (1, 3), (-1, -1)]
