"""experiment=sim_to_real's interleaved grid (``tasks.sim_to_real.real_grid``) and the pure parts
around it: every point runs at once in the grid's pool with the shapes it is meant to have, the
grid's parts alternate with the slices' runs, the grid's profile holds every run out, the fit
recovers known costs, and the steps table shows drift on one time line. The real model is not
needed: runs are simulated, or the executor stands in."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvbench.allocators import make_allocator
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import Scheduler, simulate
from kvbench.engine.cost_model import IterationShape
from kvbench.engine.profiled import PROFILE_TERMS, STAIR_TERMS, SWAP_TERMS, ProfiledCostModel
from kvbench.engine.scheduler import SchedulerLimits
from kvbench.executors.real import _iteration_start_s
from kvbench.tasks.sim_to_real import run as sim_to_real
from kvbench.tasks.sim_to_real.real_grid import (
    DECODE_STEPS,
    GRID_POOL_SLOTS,
    IDLE_WAITS_S,
    RealGridPoint,
    grid_pool_slots,
    real_grid,
)
from kvbench.tasks.sim_to_real.run import (
    FIT_SOURCE,
    INTERLEAVED_GRID_SOURCE,
    LOCAL_GRID_SOURCE,
    REPEAT_SOURCE,
    RealRunRecord,
    ReplayJob,
    compare_all,
    compare_repeats,
    drift_scales,
    fit_on_runs,
    measure_interleaved,
    real_steps_frame,
    scale_coefficients,
)
from kvbench.tasks.sim_to_real.table import drift_lines
from kvbench.tasks.sim_to_real.vllm_grid import GRID_REPEATS

LIMITS = SchedulerLimits(max_model_len=64)
COSTS = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {
    "fixed_s": 0.05, "per_seq_s": 0.005, "per_token_s": 0.002, "per_context_token_s": 1e-4,
    "per_mixed_step_s": 0.004}


def _simulated(point: RealGridPoint, max_model_len: int = 64):
    allocator = make_allocator(point.allocator, grid_pool_slots(max_model_len), point.block_size,
                               max_model_len)  # fmt: skip
    return simulate(point.requests(), Scheduler(SchedulerLimits(max_model_len=max_model_len)),
                    allocator, ProfiledCostModel(COSTS, point.block_size))  # fmt: skip


@pytest.mark.parametrize("max_model_len", [64, 256])  # sim_to_real, sim_to_real_long
def test_every_grid_point_runs_at_once_in_the_grids_pool(max_model_len):
    points = real_grid(LIMITS.max_num_seqs, max_model_len)
    assert {point.block_size for point in points} == {1, 16}
    assert grid_pool_slots(max_model_len) == GRID_POOL_SLOTS * max_model_len // 64
    for point in points:
        assert point.num_slots() <= grid_pool_slots(max_model_len)
        result = _simulated(point, max_model_len)
        assert all(record.status == "finished" for record in result.requests)
        assert sum(result.steps.columns["num_preempted"]) == 0
    # A point longer than the model's context, or wider than the sequence limit, is left out.
    assert all(p.prompt_tokens + p.decode_steps + 1 <= 32 for p in real_grid(256, 32))
    assert max(p.num_seqs for p in real_grid(4, 64)) == 4


def test_a_longer_context_gets_the_grid_at_its_lengths_too():
    short, long = real_grid(LIMITS.max_num_seqs, 64), real_grid(LIMITS.max_num_seqs, 256)
    assert len(long) == len(set(long))
    assert [p for p in long if p in short] == short  # every 64-token point, in its order
    decodes = [p for p in long if p.decode_steps and not p.joining_prompts and not p.wait_s]
    # Six decodes at a 208-token prompt (52 x 4) under either layout: 6 x 256 slots of the
    # buddy arena in the grid's pool of 4,096.
    assert {(p.block_size, p.num_seqs, p.prompt_tokens) for p in decodes} >= {
        (1, 6, 208), (16, 6, 208)}  # fmt: skip
    assert RealGridPoint(16, 2, 96, DECODE_STEPS, (192,)) in long  # a mixed point at 4x


def test_the_grid_decodes_every_batch_the_runs_have():
    # A stair is fitted only where some step computes its count of tokens (tasks.profile.fit):
    # the experiment's runs decode batches of 1-6, and a batch of 3 or 5 cost no line's price.
    points = real_grid(LIMITS.max_num_seqs, 64)
    decode_only = {p.num_seqs for p in points
                   if p.decode_steps and not p.joining_prompts and not p.wait_s}  # fmt: skip
    assert decode_only == {1, 2, 3, 4, 5, 6}


def test_the_grid_spans_prefill_decode_and_mixed_steps():
    kinds = set()
    for point in real_grid(LIMITS.max_num_seqs, 64):
        columns = _simulated(point).steps.columns
        for prefill, decode in zip(columns["num_prefill_tokens"], columns["num_decode_tokens"],
                                   strict=True):  # fmt: skip
            kinds.add((prefill > 0, decode > 0))
        if point.joining_prompts:  # the joiners are computed beside the first decode
            assert columns["num_prefill_tokens"][1] == sum(point.joining_prompts)
            assert columns["num_decode_tokens"][1] == point.num_seqs
    assert kinds == {(True, False), (False, True), (True, True)}


def test_the_grids_idle_points_wait_before_their_first_step():
    waiting = [point for point in real_grid(LIMITS.max_num_seqs, 64) if point.wait_s]
    assert [point.wait_s for point in waiting] == list(IDLE_WAITS_S)
    wake_costs = COSTS | {"wake_per_sqrt_idle_s": 0.01, "wake_per_idle_s": 0.02}
    for point in waiting:
        allocator = make_allocator(point.allocator, GRID_POOL_SLOTS, point.block_size, 64)
        model = ProfiledCostModel(wake_costs, point.block_size)
        columns = simulate(point.requests(), Scheduler(LIMITS), allocator, model).steps.columns
        assert columns["time_s"][0] == point.wait_s and len(columns["time_s"]) == 4
        warm_s = ProfiledCostModel(COSTS, point.block_size).iteration_time_s(
            IterationShape(20, 210, 0, 0, num_prefill_seqs=1))  # fmt: skip
        wake_s = 0.01 * point.wait_s**0.5 + 0.02 * point.wait_s
        assert columns["duration_s"][0] == pytest.approx(warm_s + wake_s)


def test_a_points_requests_and_slots():
    point = RealGridPoint(16, 2, 24, 3, (48,))
    assert [(r.request_id, r.arrival_s > 0, r.prompt_tokens, r.output_tokens)
            for r in point.requests()] == [(0, False, 24, 4), (1, False, 24, 4),
                                           (2, True, 48, 1)]  # fmt: skip
    assert point.num_slots() == 32 + 32 + 64  # 28, 28 and 49 tokens in blocks of 16
    assert RealGridPoint(1, 1, 40, 3).num_slots() == 64  # a buddy extent of 44 tokens: 64


def test_a_busy_iteration_starts_where_the_last_ended():
    assert _iteration_start_s(1.0004, 1.0, float("-inf")) == 1.0  # back to back
    assert _iteration_start_s(1.0004, None, 0.5) == 1.0004  # after an idle wait
    # A request that arrived in between: the iteration cannot have started before it.
    assert _iteration_start_s(1.0004, 1.0, 1.0002) == 1.0004
    assert _iteration_start_s(1.0004, 1.0, 0.9) == 1.0  # it arrived during the last iteration


def test_the_latest_arrival_queued_is_the_one_an_iteration_waits_for():
    # One request arrived during the last iteration, one after it ended: the earliest of the
    # two would let the iteration start before the second arrived.
    from kvbench.engine.arrival_queue import Arrivals
    from kvbench.engine.samples import SampleGroups
    from kvbench.engine.scheduler import SchedulerLimits

    requests = [Request(0, 0.040, 8, 2), Request(1, 0.0501, 8, 2), Request(2, 0.3, 8, 2)]
    arrivals = Arrivals(requests)
    assert arrivals.latest_arrival_s == float("-inf")
    arrivals.admit_until(0.0504, Scheduler(SchedulerLimits(max_model_len=64)),
                         SampleGroups(next_seq_id=arrivals.first_free_seq_id))  # fmt: skip
    assert arrivals.latest_arrival_s == 0.0501
    assert _iteration_start_s(0.0504, 0.050, arrivals.latest_arrival_s) == 0.0504


JOBS = [ReplayJob("a", 0.5, []), ReplayJob("a", 4.0, []), ReplayJob("b", 0.5, [])]


def _interleaved(monkeypatch, repeat_replays: bool):
    """measure_interleaved over JOBS and the grid with stand-ins for the executor and serving:
    its three lists and what was served, in order."""
    served = []

    def fake_serve(workload, rate, allocator_name, requests, executor, limits):
        served.append((workload, rate, allocator_name))
        return RealRunRecord(workload, rate, allocator_name, requests, None, [], [], 1)

    class FakeExecutor:
        def __init__(self, model, allocator, backend, kv_dtype):
            self.allocator = allocator
            assert (backend, kv_dtype) == ("sdpa", None)

        def warm_up(self, limits=None):
            pass

    monkeypatch.setattr(sim_to_real, "serve", fake_serve)
    monkeypatch.setattr("kvbench.executors.real.RealExecutor", FakeExecutor)
    points = real_grid(LIMITS.max_num_seqs, 64)
    cfg = SimpleNamespace(allocators=["naive_max", "paged"],
                          allocator=SimpleNamespace(block_size=16),
                          executor=SimpleNamespace(decode_backend="sdpa"),
                          model=SimpleNamespace(kv_dtype=None))  # fmt: skip
    return (*measure_interleaved(None, JOBS, points, cfg, LIMITS, 186, repeat_replays), served)


def test_the_grids_parts_alternate_with_the_slices_runs(monkeypatch):
    runs, grid_runs, repeat_runs, served = _interleaved(monkeypatch, repeat_replays=False)
    assert repeat_runs == []
    points = real_grid(LIMITS.max_num_seqs, 64)
    assert [(r.workload, r.rate, r.allocator) for r in runs] == [
        ("a", 0.5, "naive_max"), ("a", 0.5, "paged"), ("a", 4.0, "naive_max"),
        ("a", 4.0, "paged"), ("b", 0.5, "naive_max"), ("b", 0.5, "paged")]  # fmt: skip
    # Part k is served before the k-th job, the last after them all.
    order = [("grid" if workload == "grid" else "run") for workload, _, _ in served]
    boundaries = [i for i in range(1, len(order)) if order[i] != order[i - 1]]
    assert order[0] == "grid" and order[-1] == "grid" and len(boundaries) == 6
    assert sorted({run.grid_part for run in grid_runs}) == [0, 1, 2, 3]
    assert len(grid_runs) == GRID_REPEATS * len(points)
    for index in range(len(points)):  # each point's copies in different parts
        parts = [run.grid_part for run in grid_runs if run.grid_point == index]
        assert len(parts) == len(set(parts)) == GRID_REPEATS


def test_the_second_pass_serves_every_run_again_after_the_grids_last_part(monkeypatch):
    runs, grid_runs, repeat_runs, served = _interleaved(monkeypatch, repeat_replays=True)
    assert not any(run.repeat for run in runs) and all(run.repeat for run in repeat_runs)
    assert [(r.job, r.workload, r.rate, r.allocator) for r in repeat_runs] == [
        (r.job, r.workload, r.rate, r.allocator) for r in runs]
    # The first pass and the grid as without repeats, then the second pass, all after the grid.
    last_grid = max(i for i, (workload, _, _) in enumerate(served) if workload == "grid")
    assert len(served) - 1 - last_grid == len(repeat_runs) == 6
    assert len(runs) == 6 and sorted({run.grid_part for run in grid_runs}) == [0, 1, 2, 3]


def _measured(workload: str, requests: list[Request], costs: dict[str, float]) -> RealRunRecord:
    """A run whose 'measured' side is a simulation priced by ``costs`` (the truth)."""
    allocator = make_allocator("paged", 186, 16, 64)
    result = simulate(requests, Scheduler(LIMITS), allocator, ProfiledCostModel(costs, 16))
    return RealRunRecord(workload, 4.0, "paged", requests, result, [], [], 16)


def test_the_grid_profiles_hold_every_run_out_and_the_fit_slice_only_its_own():
    requests = [Request(i, 0.1 * i, 8 + 4 * i, 6 + i) for i in range(6)]
    slower = scale_coefficients(COSTS, 1.2)  # the machine 20 % slower during run b
    runs = [_measured("a", requests, COSTS), _measured("b", requests, slower)]
    runs = [dataclasses.replace(run, job=job) for job, run in enumerate(runs)]
    profiles = {INTERLEAVED_GRID_SOURCE: COSTS, FIT_SOURCE: COSTS, LOCAL_GRID_SOURCE: COSTS}
    deployment = get_deployment("smollm2-135m", "cpu", kv_cache_gib=0.008)
    table, pairs = compare_all(runs, profiles, "a", LIMITS, 186, 64, deployment,
                               {LOCAL_GRID_SOURCE: [1.0, 1.2]})  # fmt: skip
    for source in (INTERLEAVED_GRID_SOURCE, LOCAL_GRID_SOURCE):
        rows = table[table["source"] == source]
        assert len(rows) == 2 and rows["held_out"].all()
    fit_rows = table[table["source"] == FIT_SOURCE].set_index("workload")
    assert not fit_rows.loc["a", "held_out"] and fit_rows.loc["b", "held_out"]
    # The truth's own costs predict run a exactly, not run b (its steps cost 20 % more) ...
    grid_rows = table[table["source"] == INTERLEAVED_GRID_SOURCE].set_index("workload")
    assert grid_rows.loc["a", "e2e_mape_pct"] == pytest.approx(0.0)
    assert grid_rows.loc["b", "e2e_mape_pct"] > 10.0
    # ... unless scaled by run b's drift.
    local_rows = table[table["source"] == LOCAL_GRID_SOURCE].set_index("workload")
    assert local_rows["e2e_mape_pct"].tolist() == pytest.approx([0.0, 0.0], abs=1e-9)
    assert set(pairs["source"]) == set(profiles)


def test_a_repeat_scores_the_first_runs_noise_against_the_same_requests_served_again():
    requests = [Request(i, 0.1 * i, 8 + 4 * i, 6 + i) for i in range(6)]
    runs = [dataclasses.replace(_measured(workload, requests, COSTS), job=job)
            for job, workload in enumerate("ab")]  # fmt: skip
    # Run a served again just as fast; run b's repeat on a machine 20 % slower.
    repeats = [dataclasses.replace(runs[0], repeat=True),
               dataclasses.replace(_measured("b", requests, scale_coefficients(COSTS, 1.2)),
                                   job=1, repeat=True)]  # fmt: skip
    deployment = get_deployment("smollm2-135m", "cpu", kv_cache_gib=0.008)
    table, pairs = compare_repeats(runs, repeats[::-1], deployment)  # matched by job, not order
    assert set(table["source"]) == set(pairs["source"]) == {REPEAT_SOURCE}
    assert table["held_out"].all() and list(table["workload"]) == ["a", "b"]
    rows = table.set_index("workload")
    assert rows.loc["a", "e2e_mape_pct"] == 0.0 and rows.loc["a", "num_compared"] == 6
    assert rows.loc["b", "e2e_mape_pct"] > 10.0
    assert rows.loc["b", "output_token_throughput_error_pct"] < 0  # the repeat ran slower


def test_drift_scales_read_the_grid_parts_around_each_slice():
    shape = IterationShape(0, 0, 2, 40)
    costs = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}
    grid_runs = [_record([shape] * 3, [d] * 3, 0.0, part=part, workload="grid")
                 for part, d in ((0, 0.1), (1, 0.12), (1, 0.12), (2, 0.13))]  # fmt: skip
    # Job 0 between parts 0 and 1 (3 steps at 1.0, 6 at 1.2), job 1 between parts 1 and 2.
    assert drift_scales(grid_runs, costs, 2) == pytest.approx([1.2, 1.2])
    grid_runs[1] = _record([shape] * 3, [0.1] * 3, 0.0, part=1, workload="grid")
    assert drift_scales(grid_runs, costs, 2) == pytest.approx([1.0, 1.2])


def _record(shapes, durations, start_unix_s, block_size=16, part=-1, point=-1, workload="a",
            idle_before_s=None):  # fmt: skip
    columns = {"time_s": [0.1 * i for i in range(len(shapes))], "duration_s": durations}
    result = SimpleNamespace(steps=SimpleNamespace(columns=columns))
    idle_before_s = idle_before_s or [0.0] * len(shapes)
    return RealRunRecord(workload, 4.0 if part < 0 else float("nan"), "paged", [], result,
                         shapes, idle_before_s, block_size, start_unix_s, point,
                         part)  # fmt: skip


def test_the_fit_recovers_the_costs_the_steps_were_priced_by():
    # Decode batches on both sides of every stair, so that each stair is seen.
    shapes = [IterationShape(tokens, tokens * (tokens + 1) // 2, decodes, decodes * context,
                             num_prefill_seqs=1 if tokens else 0)
              for tokens in (0, 8, 32) for decodes in (0, 1, 2, 3, 4, 6, 8, 16)
              for context in (10, 40) if tokens or decodes]  # fmt: skip
    costs = COSTS | {"stair_4_tokens_s": 0.01, "stair_16_tokens_s": 0.003}
    for block_size in (1, 16):
        model = ProfiledCostModel(costs, block_size)
        run = _record(shapes, [model.iteration_time_s(shape) for shape in shapes], 0.0,
                      block_size)  # fmt: skip
        fitted = fit_on_runs([run])
        for term in ("fixed_s", "per_seq_s", "per_token_s", "per_mixed_step_s", *STAIR_TERMS):
            assert fitted[term] == pytest.approx(costs[term], rel=1e-6, abs=1e-9), term
        # Under block size 1 a context token is a block: the two terms are one feature.
        per_context_s = fitted["per_context_token_s"] + fitted["per_context_block_s"] / block_size
        assert per_context_s == pytest.approx(COSTS["per_context_token_s"], rel=1e-6)
        assert fitted["swap_per_token_s"] == 0.0
        assert fitted["wake_per_sqrt_idle_s"] == fitted["wake_per_idle_s"] == 0.0  # no waits


def test_the_fit_prices_the_wake_up_after_an_idle_wait_apart_from_the_shape():
    # Contexts that differ between shapes: one mean context for all would be the fixed term.
    shapes = [IterationShape(tokens, tokens * (tokens + 1) // 2, decodes, decodes * context,
                             num_prefill_seqs=1 if tokens else 0)
              for tokens in (0, 8, 32) for decodes in (1, 3, 6)
              for context in (30, 60)]  # fmt: skip
    costs = COSTS | {"wake_per_sqrt_idle_s": 0.01, "wake_per_idle_s": 0.008}
    model = ProfiledCostModel(costs, 16)
    # Every shape warm, and some again as the first step after waits of 0.1-4 s.
    idle_before_s = [0.0] * len(shapes) + [0.5, 1.0, 2.0, 4.0, 0.25, 0.1]
    shapes = shapes + shapes[1:7]
    durations = [model.iteration_time_s(shape) + model.wake_time_s(idle_s)
                 for shape, idle_s in zip(shapes, idle_before_s, strict=True)]  # fmt: skip
    fitted = fit_on_runs([_record(shapes, durations, 0.0, idle_before_s=idle_before_s)])
    assert fitted["wake_per_sqrt_idle_s"] == pytest.approx(0.01, rel=1e-6)
    assert fitted["wake_per_idle_s"] == pytest.approx(0.008, rel=1e-6)
    assert fitted["fixed_s"] == pytest.approx(COSTS["fixed_s"], rel=1e-6)


def test_the_steps_table_puts_grid_and_runs_on_one_time_line_and_shows_drift():
    shape = IterationShape(0, 0, 1, 40)
    grid_costs = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}
    runs = [
        _record([shape, shape], [0.1, 0.1], 1000.0, part=0, point=3, workload="grid"),
        _record([shape], [0.11], 1050.0),
        _record([shape, shape], [0.12, 0.12], 1100.0, part=1, point=3, workload="grid"),
    ]
    steps = real_steps_frame(runs[::-1], COSTS, grid_costs)  # any order in: time order out
    assert list(steps["phase"]) == ["grid", "grid", "replay", "grid", "grid"]
    assert steps["unix_time_s"].is_monotonic_increasing
    assert steps.loc[1, "unix_time_s"] == pytest.approx(1000.1)
    assert (steps["grid_fitted_s"] == 0.1).all()
    assert steps.loc[2, "fitted_s"] == pytest.approx(0.05 + 0.005 + 0.002 + 40e-4)
    lines = drift_lines(steps)
    assert [line.split(" (")[0] for line in lines] == ["- grid part 0", "- a @ 4 req/s",
                                                       "- grid part 1"]  # fmt: skip
    assert lines[0].endswith("1.000") and lines[1].endswith("1.100")
    assert lines[2].endswith("1.200") and "from minute 1.7" in lines[2]
    # Every column is defined in the table's own section of docs/metrics.md.
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    section = docs.split("`real_steps.parquet`", 1)[1].split("\n## ", 1)[0]
    assert [column for column in steps.columns if f"`{column}`" not in section] == []


def test_a_repeat_is_its_own_stretch_of_the_drift():
    shape = IterationShape(0, 0, 1, 40)
    grid_costs = dict.fromkeys((*PROFILE_TERMS, *SWAP_TERMS), 0.0) | {"fixed_s": 0.1}
    first = _record([shape], [0.1], 1000.0)
    again = dataclasses.replace(_record([shape], [0.13], 1100.0), repeat=True)
    steps = real_steps_frame([first, again], COSTS, grid_costs)
    assert list(steps["phase"]) == ["replay", "repeat"]
    lines = drift_lines(steps)
    assert [line.split(" (from")[0] for line in lines] == ["- a @ 4 req/s",
                                                           "- a @ 4 req/s (repeat)"]  # fmt: skip
    assert lines[0].endswith("1.000") and lines[1].endswith("1.300")
