"""``scheduler=vllm_v1`` in the simulation: ``engine.simulate_v1`` on the clock with the cost
model, its request and step records, the naive allocators under v1, the config's choices; and
the step rows it writes against real vLLM's steps (peer)."""

from __future__ import annotations

import math
import random

import pytest
from referee_support import peer
from test_configs import _compose

from kvbench.allocators import make_allocator
from kvbench.config import ConfigError, validate_config
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel
from kvbench.engine.records import EXCEEDS_POOL, PREFIX_LOOKUP_COLUMNS, STEP_COLUMNS
from kvbench.engine.scheduler_v1 import V1Limits, run_v1_steps
from kvbench.engine.simulate_v1 import simulate_v1
from kvbench.tasks.simulate.experiment import v1_memory

LIMITS = V1Limits(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=1024)


def _simulate(requests, allocator_name="paged_prefix", num_slots=16 * 99, limits=LIMITS):  # type: ignore[no-untyped-def]
    from kvbench.core.catalog import get_deployment

    deployment = get_deployment("opt-13b", "a100-40gb")
    allocator = make_allocator(allocator_name, num_slots, 16, limits.max_model_len)
    return simulate_v1(requests, v1_memory(allocator_name, allocator, limits), limits,
                       RooflineCostModel(deployment), num_slots)  # fmt: skip


def _paged_prefix(num_slots: int, limits: V1Limits):  # type: ignore[no-untyped-def]
    """vLLM's KV-cache manager with prefix caching over ``num_slots`` slots in blocks of 16."""
    allocator = make_allocator("paged_prefix", num_slots, 16, limits.max_model_len)
    return v1_memory("paged_prefix", allocator, limits)


def _shared_workload() -> list[Request]:
    shared = dict(prefix_group=3, prefix_tokens=200)
    return [Request(i, 0.0, 250 + 10 * i, 20 + i, **shared) for i in range(6)]  # type: ignore[arg-type]


def test_steps_are_the_step_models_steps_on_the_clock() -> None:
    requests = _shared_workload()
    result = _simulate(requests)
    model = run_v1_steps(requests, _paged_prefix(16 * 99, LIMITS), LIMITS)
    columns = result.steps.columns
    assert len(columns["step"]) == len(model)
    assert list(columns["num_blocks_in_use"]) == [step.num_blocks_in_use for step in model]
    assert list(columns["batch_size"]) == [len(step.scheduled_tokens) for step in model]
    tokens = [p + d for p, d in zip(columns["num_prefill_tokens"], columns["num_decode_tokens"],
                                    strict=True)]  # fmt: skip
    assert tokens == [sum(n for _, n in step.scheduled_tokens) for step in model]
    assert list(columns["prefix_hit_tokens"]) == [step.prefix_hit_tokens for step in model]
    assert sum(columns["prefix_hit_tokens"]) > 0  # the shared 200 tokens hit
    # The clock: each step starts when the one before ended.
    times = columns["time_s"]
    assert all(math.isclose(times[i] + columns["duration_s"][i], times[i + 1])
               for i in range(len(times) - 1))  # fmt: skip


def test_a_prompt_longer_than_the_budget_is_chunked_not_rejected() -> None:
    result = _simulate([Request(0, 0.0, 500, 4)])
    record = result.requests[0]
    assert record.status == "finished"
    steps = result.steps.columns
    # 500 prompt tokens in chunks of 128: the first token comes out at the end of the 4th step.
    assert list(steps["num_prefill_tokens"][:4]) == [128, 128, 128, 116]
    assert record.first_token_s == pytest.approx(steps["time_s"][3] + steps["duration_s"][3])
    assert record.admit_s == 0.0


def test_requests_arrive_on_the_clock_and_an_idle_engine_jumps_to_the_next() -> None:
    result = _simulate([Request(0, 0.0, 50, 3), Request(1, 100.0, 50, 3)])
    first, second = result.requests
    assert first.finish_s < 1.0 and second.admit_s == 100.0
    assert second.first_token_s > 100.0


def test_a_request_larger_than_the_pool_is_rejected_as_exceeding_it() -> None:
    result = _simulate([Request(0, 0.0, 200, 10), Request(1, 0.0, 30, 3)], num_slots=16 * 10)
    assert [r.status for r in result.requests] == ["rejected", "finished"]
    assert result.requests[0].reject_reason == EXCEEDS_POOL


@pytest.mark.parametrize("name", ["naive_max", "naive_pow2", "naive_oracle"])
def test_naive_allocators_reserve_at_admission_under_v1(name: str) -> None:
    requests = [Request(i, 0.0, 300, 30) for i in range(5)]
    result = _simulate(requests, name, num_slots=2100)
    assert all(record.status == "finished" for record in result.requests)
    # A reservation never runs out: no preemption; naive_max reserves 1,024 slots each.
    assert sum(result.steps.columns["num_preempted"]) == 0
    if name == "naive_max":
        assert max(result.steps.columns["batch_size"]) == 2
        assert max(record.peak_slots for record in result.requests) == 1024
    if name == "naive_oracle":  # 330 slots each, in buddy blocks of 512: 4 fit 2,100 slots
        assert max(result.steps.columns["batch_size"]) == 4


def test_v0_steps_carry_blocks_in_use_and_zero_lookups() -> None:
    from kvbench.core.catalog import get_deployment
    from kvbench.engine import Scheduler, SchedulerLimits, simulate

    deployment = get_deployment("opt-13b", "a100-40gb")
    requests = [Request(i, 0.0, 100, 40) for i in range(4)]
    for fast in (False, True):
        result = simulate(requests, Scheduler(SchedulerLimits(1024)),
                          make_allocator("paged", 16 * 50, 16, 1024),
                          RooflineCostModel(deployment), fast=fast)  # fmt: skip
        columns = result.steps.columns
        assert set(STEP_COLUMNS) == set(columns)
        parts = ("token_states_slots", "reservation_slots", "internal_frag_slots")
        held = [sum(row) for row in zip(*(columns[name] for name in parts), strict=True)]
        assert list(columns["num_blocks_in_use"]) == [slots // 16 for slots in held]
        assert columns["num_blocks_in_use"][0] == 4 * 7  # 100 prompt tokens: 7 blocks each
        for name in PREFIX_LOOKUP_COLUMNS:
            assert set(columns[name]) == {0}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["scheduler=vllm_v1", "scheduler.preemption=swap"], "recompute only"),
        (["scheduler=vllm_v1", "+workload.num_samples=2"], "scheduler=vllm_v0 only"),
        (["scheduler=vllm_v1", "scheduler.max_num_batched_tokens=16"], "token budget"),
        (["scheduler.name=vllm_v2"], "scheduler.name='vllm_v2': allowed are vllm_v0, vllm_v1"),
        (["scheduler=vllm_v1", "scheduler.policy=lpm"], "lpm runs under scheduler=vllm_v0"),
        (["scheduler=vllm_v1", "allocators=[vattention]"],
         "'vattention': scheduler=vllm_v1 runs .*paged_hybrid_prefix; drop it"),
    ],
)
def test_v1_config_errors_name_the_problem(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(_compose(*overrides))


def test_the_root_default_stays_the_papers_engine() -> None:
    typed, _ = validate_config(_compose())
    assert typed.scheduler.name == "vllm_v0"
    typed, _ = validate_config(_compose("scheduler=vllm_v1"))
    assert (typed.scheduler.max_num_seqs, typed.scheduler.max_num_batched_tokens) == (256, 2048)


@peer
def test_simulated_step_rows_match_vllms_steps() -> None:
    from kvbench.referee.vllm_v1 import RefereeLimits, run_referee

    requests = [*_shared_workload(), Request(6, 0.0, 400, 30), Request(7, 0.0, 90, 50)]
    limits = V1Limits(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024)
    num_gpu_blocks = 60  # small enough to preempt
    result = _simulate(requests, num_slots=16 * (num_gpu_blocks - 1), limits=limits)
    referee = run_referee(requests, RefereeLimits(16, num_gpu_blocks, 4, 256, 1024, True))
    columns = result.steps.columns
    assert sum(columns["num_preempted"]) > 0
    ours = list(zip(columns["batch_size"], columns["num_blocks_in_use"], columns["num_preempted"],
                    [p + d for p, d in zip(columns["num_prefill_tokens"],
                                           columns["num_decode_tokens"], strict=True)],
                    columns["num_waiting"], *(columns[name] for name in PREFIX_LOOKUP_COLUMNS),
                    strict=True))  # fmt: skip
    theirs = [(len(s.scheduled_tokens), s.num_blocks_in_use, len(s.preempted_request_ids),
               sum(n for _, n in s.scheduled_tokens), s.num_waiting, s.prefix_query_tokens,
               s.prefix_hit_tokens, s.resumed_query_tokens, s.resumed_hit_tokens)
              for s in referee]  # fmt: skip
    assert ours == theirs


def _random_workload(seed: int, num_requests: int) -> list[Request]:
    rng = random.Random(seed)
    requests = []
    for request_id in range(num_requests):
        shared = {}
        if rng.random() < 0.5:
            group = rng.randrange(3)
            shared = dict(prefix_group=group, prefix_tokens=40 + 50 * group)
        requests.append(Request(request_id, rng.random() * 5, rng.randint(1, 300),
                                rng.randint(1, 80), **shared))  # type: ignore[arg-type]  # fmt: skip
    return requests


@pytest.mark.parametrize("allocator_name", ["paged", "paged_prefix", "naive_pow2"])
def test_the_fast_path_gives_the_reference_loops_records(allocator_name: str) -> None:
    import dataclasses

    from kvbench.core.catalog import get_deployment

    requests = _random_workload(3, 120)
    limits = V1Limits(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024)
    deployment = get_deployment("opt-13b", "a100-40gb")
    results = []
    for fast in (True, False):
        allocator = make_allocator(allocator_name, 16 * 150, 16, 1024)
        results.append(simulate_v1(requests, v1_memory(allocator_name, allocator, limits), limits,
                                   RooflineCostModel(deployment), 16 * 150, fast=fast))  # fmt: skip
    fast_result, reference = results
    if allocator_name != "naive_pow2":  # a reservation never preempts
        assert sum(fast_result.steps.columns["num_preempted"]) > 0  # the pool preempts
    assert fast_result.steps.columns == reference.steps.columns
    assert [dataclasses.astuple(r) for r in fast_result.requests] == [
        dataclasses.astuple(r) for r in reference.requests
    ]
    steps = run_v1_steps(requests, _paged_prefix(16 * 150, limits), limits)
    assert steps == run_v1_steps(requests, _paged_prefix(16 * 150, limits), limits, fast=False)


def random_limits(rng: random.Random, async_scheduling: bool) -> V1Limits:
    """Limits drawn to bind each way: seats, token budget, context."""
    return V1Limits(max_num_seqs=rng.choice([2, 4, 8, 16, 64]),
                    max_num_batched_tokens=rng.choice([4, 16, 64, 256, 2048]),
                    max_model_len=rng.choice([256, 512, 1024]),
                    async_scheduling=async_scheduling)  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("allocator_name",
                         ["naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix"])
def test_lazy_decodes_and_stretches_give_the_reference_loops_records(
    allocator_name: str, async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding requests advance lazily (``LazyDecoders``) and decode-only steps run as
    stretches (``decode_stretch``), synchronously or not: the records, and vLLM's free queue
    in reuse order, are the reference loop's on random workloads (prefix groups, blocks of
    1-32 slots) whose limits bind each way (seats, token budget, memory, preemption), with
    arrivals queued mid-stretch behind a blocked head, rejected ones among them; and both do
    run (far fewer scheduler steps than step rows, lazy decodes in a third of those steps or
    more)."""
    import dataclasses

    from kvbench.core.catalog import get_deployment
    from kvbench.engine.kv_cache_v1 import V1KVCache
    from kvbench.engine.scheduler_v1 import V1StepScheduler

    num_scheduled = num_blocked_stretches = num_lazy_steps = 0
    step = V1StepScheduler.step
    decode_stretch = V1StepScheduler.decode_stretch

    def counted_step(self: V1StepScheduler, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal num_scheduled, num_lazy_steps
        num_scheduled += 1
        v1_step = step(self, *args, **kwargs)
        num_lazy_steps += v1_step.num_lazy_decodes > 0
        return v1_step

    def counted_stretch(self: V1StepScheduler):  # type: ignore[no-untyped-def]
        nonlocal num_blocked_stretches
        stretch = decode_stretch(self)
        num_blocked_stretches += stretch is not None and stretch.memory_blocked
        return stretch

    monkeypatch.setattr(V1StepScheduler, "step", counted_step)
    monkeypatch.setattr(V1StepScheduler, "decode_stretch", counted_stretch)
    cost_model = RooflineCostModel(get_deployment("opt-13b", "a100-40gb"))
    num_rows = num_fast_steps = num_preempted = 0
    for seed in range(30):
        rng = random.Random(seed)
        limits = random_limits(rng, async_scheduling)
        # Empty prompts and ones longer than max_model_len arrive too (rejected on arrival).
        span_s = rng.choice([0.5, 5.0, 50.0])
        requests = []
        for request_id in range(rng.randint(1, 60)):
            shared = {}
            if rng.random() < 0.5:
                group = rng.randrange(3)
                shared = dict(prefix_group=group, prefix_tokens=20 + 50 * group)
            prompt_tokens = max(rng.randint(0, 300), shared.get("prefix_tokens", 0))
            requests.append(Request(request_id, rng.random() * span_s, prompt_tokens,
                                    rng.randint(0, 120), **shared))  # type: ignore[arg-type]  # fmt: skip
        num_slots = rng.choice([600, 1500, 4000, 20000])
        block_size = rng.choice([1, 2, 16, 32])
        results = []
        free_queues = []
        for fast in (True, False):
            num_scheduled = 0
            allocator = make_allocator(allocator_name, num_slots, block_size, limits.max_model_len)
            memory = v1_memory(allocator_name, allocator, limits)
            results.append(simulate_v1(requests, memory, limits, cost_model, num_slots,
                                       fast=fast))  # fmt: skip
            if isinstance(memory, V1KVCache):
                free_queues.append((memory.free_block_ids(), memory.num_evicted_blocks))
            if fast:
                num_fast_steps += num_scheduled
        fast_result, reference = results
        assert fast_result.steps.columns == reference.steps.columns, seed
        assert [dataclasses.astuple(r) for r in fast_result.requests] == [
            dataclasses.astuple(r) for r in reference.requests
        ], seed
        assert free_queues[:1] == free_queues[1:], seed
        num_rows += len(reference.steps.columns["step"])
        num_preempted += sum(reference.steps.columns["num_preempted"])
    assert num_blocked_stretches > 0  # stretches run behind a head blocked for memory
    if allocator_name.startswith("paged"):
        assert num_preempted > 0
    assert num_fast_steps < 0.6 * num_rows
    assert num_lazy_steps > num_fast_steps / 3  # the other steps' decodes run lazily


def test_a_v1_run_writes_the_tables_with_every_column_documented(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd
    from conftest import compose_config
    from test_metrics_docs import _documented

    from kvbench.tasks.simulate.experiment import run_experiment

    # Prompts of 3,000 tokens: beyond the 2,048-token budget, which v1 prefills in chunks.
    cfg, deployment, raw = compose_config(
        "scheduler=vllm_v1", "workload=fixed", "workload.num_requests=12",
        "workload.prompt_tokens=3000", "workload.output_tokens=20", "model=opt-13b",
        "hardware=a100-40gb", "model.max_model_len=4096", "progress=false", "plots=false",
        "summary_table=false",
    )  # fmt: skip
    run_experiment(cfg, deployment, raw, tmp_path)
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert (requests["status"] == "finished").all()
    assert steps["num_prefill_tokens"].max() <= 2048
    assert steps.groupby("allocator")["num_blocks_in_use"].max()["paged"] > 0
    for table in ("summary", "steps", "requests"):
        columns = pd.read_parquet(tmp_path / f"{table}.parquet").columns
        assert [c for c in columns if not _documented(c)] == []


def test_v1_usage_covers_the_whole_pool_and_a_blocked_step_frees_nothing() -> None:
    requests = [Request(i, 0.0, 200, 60) for i in range(8)]
    result = _simulate(requests, "paged", num_slots=16 * 40 + 5)  # 5 slots no block holds
    columns = result.steps.columns
    for step in range(len(columns["step"])):
        parts = ("token_states_slots", "reservation_slots", "internal_frag_slots",
                 "external_frag_slots", "free_slots")  # fmt: skip
        assert sum(columns[name][step] for name in parts) == 16 * 40 + 5
        if columns["memory_blocked"][step]:
            assert columns["free_slots"][step] == 0
        else:
            assert columns["external_frag_slots"][step] == 5
    assert any(columns["memory_blocked"])
