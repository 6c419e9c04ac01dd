"""The engine's fast path gives exactly the step-by-step loop's records (issue: fast engine).

Every comparison is exact (==): the same floats to the last digit, the same integers, the same
request records, the same allocator state at the end.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from conftest import SHARED_TRACE_FILES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_paged_hybrid import count_cohort_rounds, hybrid_over, random_layout

from kvbench.allocators import ALLOCATOR_NAMES, MemoryUsage, make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import IterationShape, RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine import records as records_module
from kvbench.engine.cost_model import decode_time_by_shape
from kvbench.workloads import load_trace, to_requests

OPT13B = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
MAX_LEN = 2048


def _run(requests, allocator_name, num_slots, block_size, limits, fast, **kwargs):
    allocator = make_allocator(allocator_name, num_slots, block_size, limits.max_model_len)
    result = simulate(requests, Scheduler(limits), allocator, RooflineCostModel(OPT13B),
                      fast=fast, **kwargs)
    return result, allocator


def _assert_identical(requests, allocator_name, num_slots, block_size, limits):
    fast, fast_allocator = _run(requests, allocator_name, num_slots, block_size, limits, True)
    ref, ref_allocator = _run(requests, allocator_name, num_slots, block_size, limits, False)
    assert fast.steps.columns == ref.steps.columns
    assert fast.requests == ref.requests
    assert fast.num_copy_on_writes == ref.num_copy_on_writes
    assert fast_allocator.usage() == ref_allocator.usage()
    assert _free_memory(fast_allocator) == _free_memory(ref_allocator)
    return fast


def _free_memory(allocator):
    """The allocator's free memory in reuse order: equal only if every allocation and release
    came in the same order."""
    if hasattr(allocator, "free_blocks"):
        return allocator.free_blocks()
    return allocator.free_extents()


@st.composite
def _workloads(draw):
    num_requests = draw(st.integers(1, 40))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    burst = draw(st.booleans())
    mean_gap_s = draw(st.sampled_from([0.001, 0.02, 0.2]))
    with_samples = draw(st.booleans())
    with_groups = draw(st.booleans())
    arrival_s = 0.0
    requests = []
    for request_id in range(num_requests):
        if not burst:
            arrival_s += rng.expovariate(1 / mean_gap_s)
        prompt_tokens = rng.randint(1, 300)
        group = rng.choice([None, 0, 1]) if with_groups else None
        requests.append(Request(
            request_id=request_id,
            arrival_s=arrival_s,
            prompt_tokens=prompt_tokens,
            output_tokens=rng.randint(1, 120),
            prefix_group=group,
            prefix_tokens=min(prompt_tokens, 64) if group is not None else 0,
            num_samples=rng.choice([1, 1, 2, 3]) if with_samples else 1,
        ))
    return requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=_workloads(),
    allocator_name=st.sampled_from(ALLOCATOR_NAMES),
    num_slots=st.sampled_from([600, 2_000, 20_000]),
    block_size=st.sampled_from([1, 4, 16, 32]),
    max_num_seqs=st.sampled_from([3, 256]),
    max_num_batched_tokens=st.sampled_from([400, 2048]),
    preemption=st.sampled_from(["recompute", "swap"]),
)
def test_fast_path_matches_the_step_by_step_loop(
    requests, allocator_name, num_slots, block_size, max_num_seqs, max_num_batched_tokens,
    preemption,
):
    limits = SchedulerLimits(max_model_len=MAX_LEN, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens,
                             preemption=preemption, swap_capacity_tokens=1_000)
    _assert_identical(requests, allocator_name, num_slots, block_size, limits)


def test_fast_path_skips_iterations_on_a_quiet_batch():
    """Two long requests: all but a few iterations run as stretches, yet records are equal."""
    requests = [Request(0, 0.0, 100, 500), Request(1, 0.0, 50, 300)]
    limits = SchedulerLimits(max_model_len=MAX_LEN)
    result = _assert_identical(requests, "paged", 20_000, 16, limits)
    assert len(result.steps) == 500
    assert list(result.steps.columns["batch_size"][:300]) == [2] * 300


# paged_hybrid_prefix has no lazy rounds (a round would cache the blocks it fills): step by
# step, which the other tests here find identical to itself.
@pytest.mark.parametrize(
    "allocator_name", [name for name in ALLOCATOR_NAMES if name != "paged_hybrid_prefix"]
)
def test_runs_advance_the_cohort_without_per_sequence_appends(allocator_name, monkeypatch):
    """With nothing to preempt, a run never appends sequence by sequence: every iteration is a
    cohort round (O(new blocks)), and the records still equal the reference's."""
    rng = random.Random(3)
    requests = [Request(i, i * 0.01, rng.randint(1, 300), rng.randint(1, 200)) for i in range(60)]
    limits = SchedulerLimits(max_model_len=MAX_LEN)
    _assert_identical(requests, allocator_name, 400_000, 16, limits)
    allocator_class = type(make_allocator(allocator_name, 16, 16, MAX_LEN))
    calls = []
    for name in ("append", "try_append_round"):
        original = getattr(allocator_class, name)
        monkeypatch.setattr(allocator_class, name, lambda *args, _name=name, _original=original:
                            calls.append(_name) or _original(*args))
    rounds = []
    original_advance = allocator_class.advance_cohort
    monkeypatch.setattr(allocator_class, "advance_cohort",
                        lambda self, n: rounds.append(n) or original_advance(self, n))
    result, _ = _run(requests, allocator_name, 400_000, 16, limits, True)
    assert calls == []
    assert sum(rounds) == len(result.steps)


def test_the_lazy_batch_over_the_hybrid_manager_gives_the_reference_records(monkeypatch):
    """paged_hybrid's running sequences grow lazily too (``HybridDecodeCohort``; its rounds
    free blocks behind windows, so no quiet stretch: each iteration admits as the step loop
    would): on random workloads (layouts of full and sliding groups with padding layers,
    blocks of 1-32 tokens, pools that preempt by recompute or swap, parallel samples forking)
    the records, the free queue in reuse order and the usage are the reference loop's, and the
    rounds free blocks behind windows, catch up after a prefill, start blocks."""
    counts = count_cohort_rounds(monkeypatch)
    num_preempted = 0
    for seed in range(40):
        rng = random.Random(seed)
        max_len = rng.choice([256, 512, 1024])
        limits = SchedulerLimits(max_model_len=max_len, max_num_seqs=rng.choice([2, 4, 8, 64]),
                                 max_num_batched_tokens=max(max_len, rng.choice([256, 2048])),
                                 preemption=rng.choice(["recompute", "swap"]),
                                 swap_capacity_tokens=rng.choice([0, 500, 5000]))  # fmt: skip
        layout = random_layout(rng)
        span_s = rng.choice([0.5, 5.0, 50.0])
        requests = [Request(request_id, rng.random() * span_s, rng.randint(1, 300),
                            rng.randint(0, 120), num_samples=rng.choice([1] * 9 + [2]))
                    for request_id in range(rng.randint(1, 60))]  # fmt: skip
        num_blocks = rng.choice([40, 100, 300, 2000])
        block_size = rng.choice([1, 2, 4, 16, 32])
        runs = []
        for fast in (True, False):
            allocator = hybrid_over(num_blocks, block_size, layout, max_len,
                                    generated_slot_ahead=True)  # fmt: skip
            result = simulate(requests, Scheduler(limits), allocator, RooflineCostModel(OPT13B),
                              fast=fast)  # fmt: skip
            runs.append((result.steps.columns, result.requests, allocator.free_blocks(),
                         allocator.usage()))  # fmt: skip
        assert runs[0] == runs[1], seed
        num_preempted += sum(runs[1][0]["num_preempted"])
    assert num_preempted > 0
    assert len(counts) == 3 and min(counts.values()) > 100, counts


TRACES = SHARED_TRACE_FILES
# Llama-3-8B on one L40S: a small pool, so the traces preempt (as test_shared_traces_replay).
L40S = get_deployment("llama-3-8b", "l40s")


def _trace_requests(path, num_requests, speedup=4.0):
    frame = load_trace(path)
    if num_requests is not None:
        frame = frame.head(num_requests)
    if frame["arrival_s"].isna().any():
        gaps_s = np.random.default_rng(0).exponential(0.05, len(frame))
        frame = frame.assign(arrival_s=np.cumsum(gaps_s))
    frame = frame.assign(arrival_s=(frame["arrival_s"] - frame["arrival_s"].min()) / speedup)
    return to_requests(frame)


def _assert_trace_identical(requests, allocator_name):
    max_len = L40S.model.max_model_len
    limits = SchedulerLimits(max_model_len=max_len, max_num_batched_tokens=max_len)
    results = []
    free_memory = []
    for fast in (True, False):
        allocator = make_allocator(allocator_name, L40S.num_kv_slots, 16, max_len)
        results.append(simulate(requests, Scheduler(limits), allocator,
                                RooflineCostModel(L40S), fast=fast))
        free_memory.append(_free_memory(allocator))
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests
    assert free_memory[0] == free_memory[1]


@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
@pytest.mark.parametrize("trace", TRACES)
def test_fast_path_matches_on_the_first_requests_of_each_trace(shared_traces, trace,
                                                               allocator_name):
    _assert_trace_identical(_trace_requests(shared_traces / trace, 300), allocator_name)


@pytest.mark.slow
@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
@pytest.mark.parametrize("trace", TRACES)
def test_fast_path_matches_on_every_request_of_each_trace(shared_traces, trace, allocator_name):
    _assert_trace_identical(_trace_requests(shared_traces / trace, None), allocator_name)


@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
def test_try_append_rounds_leave_the_state_of_single_appends(allocator_name):
    rng = random.Random(7)
    single = make_allocator(allocator_name, 40_000, 8, MAX_LEN)
    bulk = make_allocator(allocator_name, 40_000, 8, MAX_LEN)
    seq_ids = []
    for seq_id in range(12):
        request = Request(seq_id, 0.0, rng.randint(1, 90), rng.randint(30, 90))
        for allocator in (single, bulk):
            assert allocator.admit(seq_id, request, request.prompt_tokens)
        seq_ids.append(seq_id)
    for seq_id in (3, 8):  # free some, so the free queue is not in id order
        single.free(seq_id)
        bulk.free(seq_id)
        seq_ids.remove(seq_id)
    for _ in range(25):  # every request has 30 or more output tokens
        for seq_id in seq_ids:
            assert single.append(seq_id, 1)
        assert bulk.try_append_round(seq_ids)
    assert [single.block_table(i) for i in seq_ids] == [bulk.block_table(i) for i in seq_ids]
    assert single.usage() == bulk.usage()


@given(st.lists(st.integers(0, 2_000_000), min_size=1, max_size=20),
       st.integers(1, 256), st.sampled_from(["llama-2-70b", "opt-13b", "mixtral-8x7b"]))
def test_decode_time_fn_gives_the_iteration_times_bit_for_bit(contexts, num_seqs, model):
    deployment = get_deployment(model, "a100-80gb", num_gpus=4)
    costs = RooflineCostModel(deployment)
    decode_time_s = costs.decode_time_fn(num_seqs)
    for context in contexts:
        shape = IterationShape(0, 0, num_seqs, context)
        assert decode_time_s(context) == costs.iteration_time_s(shape)


@given(st.lists(st.tuples(st.integers(0, 8_192), st.integers(0, 30_000_000),
                          st.integers(0, 256), st.integers(0, 2_000_000)), min_size=1,
                max_size=20),
       st.sampled_from(["llama-2-70b", "opt-13b", "mixtral-8x7b"]))
def test_iteration_time_s_is_the_roofline_formula_bit_for_bit(shapes, model):
    """The one copy of the formula keeps the float operations, in their order, that the recorded
    durations (and the reference results) were computed with."""
    deployment = get_deployment(model, "a100-80gb", num_gpus=4)
    costs = RooflineCostModel(deployment)
    spec, hardware = deployment.model, deployment.hardware
    kv_bytes_per_token = deployment.kv_bytes_per_token
    flops_per_pair = 4 * spec.num_layers * spec.num_attention_heads * spec.head_dim
    flops_per_s = 4 * hardware.peak_tflops * 1e12 * 0.6
    bytes_per_s = 4 * hardware.hbm_bandwidth_gb_per_s * 1e9 * 0.8
    fixed_s = 0.002 + 2 * spec.num_layers * 1.0e-5
    for counts in shapes:
        shape = IterationShape(*counts)
        num_prefill_tokens, prefill_pairs, num_decode_tokens, context_tokens = counts
        num_tokens = num_prefill_tokens + num_decode_tokens
        expected_s = 0.0
        if num_tokens:
            dense_flops = 2.0 * spec.active_parameters * num_tokens
            dense_bytes = spec.weight_bytes + num_tokens * kv_bytes_per_token
            flops = dense_flops + flops_per_pair * (prefill_pairs + context_tokens)
            bytes_moved = dense_bytes + context_tokens * kv_bytes_per_token
            expected_s = fixed_s + max(flops / flops_per_s, bytes_moved / bytes_per_s)
        assert costs.iteration_time_s(shape) == expected_s


@dataclasses.dataclass(frozen=True)
class _TableCostModel:
    """A cost model that is not the roofline (a made-up table): any ``CostModel`` plugs in."""

    def iteration_time_s(self, shape):
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        return 0.0 if not num_tokens else 1e-3 + 1e-6 * num_tokens + 1e-9 * (
            shape.prefill_attention_pairs + shape.decode_context_tokens)

    def swap_time_s(self, num_tokens):
        return 1e-7 * num_tokens

    def wake_time_s(self, idle_s):
        return 0.0 if idle_s <= 0 else 2e-3 + 1e-2 * idle_s

    def decode_time_fn(self, num_decode_tokens):
        return decode_time_by_shape(self, num_decode_tokens)


@pytest.mark.parametrize("allocator_name", ["paged", "paged_prefix", "naive_pow2"])
def test_fast_path_matches_the_step_by_step_loop_with_any_cost_model(allocator_name):
    rng = random.Random(5)
    requests = [Request(i, i * 0.002, rng.randint(1, 300), rng.randint(1, 200),
                        num_samples=rng.choice([1, 1, 2])) for i in range(80)]  # fmt: skip
    limits = SchedulerLimits(max_model_len=MAX_LEN, preemption="swap", swap_capacity_tokens=500)
    results = []
    for fast in (True, False):
        allocator = make_allocator(allocator_name, 3_000, 16, MAX_LEN)
        results.append(simulate(requests, Scheduler(limits), allocator, _TableCostModel(),
                                fast=fast))  # fmt: skip
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests
    if allocator_name.startswith("paged"):  # reservations block admission instead
        assert sum(record.num_swaps for record in results[1].requests) > 0  # swaps priced too
    first_prompt_tokens = requests[0].prompt_tokens  # the first step prefills it alone
    first_shape = IterationShape(first_prompt_tokens,
                                 first_prompt_tokens * (first_prompt_tokens + 1) // 2, 0, 0)
    first_duration_s = results[1].steps.columns["duration_s"][0]
    assert first_duration_s == _TableCostModel().iteration_time_s(first_shape)


def _streamed(requests, monkeypatch, chunk_rows):
    monkeypatch.setattr(records_module, "CHUNK_ROWS", chunk_rows)
    step_chunks, record_chunks = [], []
    limits = SchedulerLimits(max_model_len=MAX_LEN)
    streamed, _ = _run(requests, "paged", 2_000, 16, limits, True,
                       step_sink=step_chunks.append, record_sink=record_chunks.append)
    kept, _ = _run(requests, "paged", 2_000, 16, limits, True)
    return streamed, kept, step_chunks, record_chunks


def test_streamed_steps_and_records_equal_the_kept_ones(monkeypatch):
    rng = random.Random(3)
    requests = [Request(i, i * 0.05, rng.randint(1, 200), rng.randint(1, 100)) for i in range(60)]
    streamed, kept, step_chunks, record_chunks = _streamed(requests, monkeypatch, 37)
    assert len(streamed.steps) == len(kept.steps) > 37
    assert not streamed.steps.columns["step"]  # everything went to the sink
    assert all(len(chunk["step"]) == 37 for chunk in step_chunks[:-1])
    for name, values in kept.steps.columns.items():
        assert [v for chunk in step_chunks for v in chunk[name]] == list(values)
    assert streamed.steps.totals() == kept.steps.totals()
    assert [record for chunk in record_chunks for record in chunk] == kept.requests
    assert streamed.requests == []


def test_step_totals_do_not_depend_on_how_steps_arrive(monkeypatch):
    """Recording decode rows one by one or in stretches of any length folds the same chunks."""
    monkeypatch.setattr(records_module, "CHUNK_ROWS", 5)
    rng = random.Random(11)
    changing = ("time_s", "duration_s", "decode_context_tokens", "num_waiting",
                "token_states_slots", "reservation_slots", "internal_frag_slots", "free_slots")
    rows = [{name: rng.random() if name.endswith("_s") else rng.randint(0, 1_000)
             for name in changing} for _ in range(23)]
    constant_slots = {"external_frag_slots": 7, "shared_slots": 3, "saved_slots": 5}
    one_by_one, in_stretches = records_module.StepRecords(), records_module.StepRecords()
    for row in rows:
        states = row["token_states_slots"]
        reservation = row["reservation_slots"]
        frag = row["internal_frag_slots"]
        usage = MemoryUsage(states + reservation + frag + 7 + row["free_slots"], states,
                            reservation, frag, 7, row["free_slots"], 3, 5)
        one_by_one.append(time_s=row["time_s"], duration_s=row["duration_s"], batch_size=4,
                          num_prefill_seqs=0, num_prefill_tokens=0, num_decode_tokens=4,
                          prefill_attention_pairs=0,
                          decode_context_tokens=row["decode_context_tokens"],
                          num_waiting=row["num_waiting"], num_swapped=0, num_preempted=0,
                          memory_blocked=False, usage=usage)
    for start, stop in ((0, 3), (3, 17), (17, 23)):
        appenders = in_stretches.decode_row_appenders(memory_blocked=False)
        for row in rows[start:stop]:
            for append, name in zip(appenders, changing, strict=True):
                append(row[name])
        in_stretches.complete_decode_rows(stop - start, num_seqs=4, memory_blocked=False,
                                          constant_slots=constant_slots)
    assert one_by_one.columns == in_stretches.columns
    assert one_by_one.totals() == in_stretches.totals()
    assert one_by_one.totals().num_steps == 23


def _summary(tmp_path, *overrides):
    from conftest import compose_config

    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(
        "model=opt-13b", "hardware=a100-40gb", "workload=fixed", "workload.num_requests=30",
        "workload.request_rate=20",
        "allocators=[paged,naive_oracle]", "plots=false", "progress=false", *overrides
    )
    out = tmp_path / ("-".join(overrides) or "default")
    return run_experiment(cfg, deployment, raw, out)


def test_config_engine_fast_false_gives_the_same_summary(tmp_path):
    fast = _summary(tmp_path)
    reference = _summary(tmp_path, "engine.fast=false")
    columns = [c for c in fast.columns if c != "simulation_wall_s"]
    assert fast[columns].equals(reference[columns])


@pytest.mark.parametrize("allocator_name", ALLOCATOR_NAMES)
def test_try_append_round_is_one_round_of_single_appends_or_nothing(allocator_name):
    single = make_allocator(allocator_name, 20_000, 4, MAX_LEN)
    bulk = make_allocator(allocator_name, 20_000, 4, MAX_LEN)
    lengths = [(7, 9), (8, 3), (1, 2), (13, 40)]
    for seq_id, (prompt_tokens, output_tokens) in enumerate(lengths):
        request = Request(seq_id, 0.0, prompt_tokens, output_tokens)
        for allocator in (single, bulk):
            assert allocator.admit(seq_id, request, prompt_tokens)
    for _ in range(3):
        seq_ids = [i for i, (p, o) in enumerate(lengths) if bulk.num_tokens(i) < p + o]
        for seq_id in seq_ids:
            assert single.append(seq_id, 1)
        assert bulk.try_append_round(seq_ids)
        assert [single.block_table(i) for i in range(4)] == [bulk.block_table(i) for i in range(4)]
        assert single.usage() == bulk.usage()
    # Nothing changes when one sequence cannot take the round: a shared partial block (paged)
    # or a sequence already at its final length (contiguous: the formulas stop there).
    if bulk.forks_share_blocks:
        assert bulk.fork(0, 9) and bulk.num_tokens(0) % bulk.block_size  # 10 tokens
        seq_ids = [3, 0]
    elif bulk.block_size == 1:
        seq_ids = [0, 2]
    else:  # vattention: forks copy, pages fill past the final length; only a full pool refuses
        return  # (tests/test_vattention.py)
    before = bulk.usage()
    tables = [bulk.block_table(i) for i in seq_ids]
    assert not bulk.try_append_round(seq_ids)
    assert bulk.usage() == before
    assert [bulk.block_table(i) for i in seq_ids] == tables
