"""``python -m kvbench experiment=sim_to_real``: real runs, an interleaved grid, profiles, errors.

Every workload slice x rate x allocator is served on the real model (``executors.real``), and
between the slices' runs the closed batches of a grid of controlled shapes (``real_grid``) are
served the same way: the grid is dealt into parts measured before, between and after the runs, so
the grid and the runs sample the same minutes of the machine. Two profiles are fitted by the same
least squares (``tasks.profile.fit``): one on the grid's steps (every slice is then held out), one
on the real iterations of the first workload (the fit slice). A third prices each slice x rate with
the grid's profile scaled by the machine's speed the grid parts just before and after it measured
(``drift_scales``); with ``executor.profile=FILE`` a ``task=profile`` file is evaluated too. The
requests of every run are simulated with each (``executor=profiled``'s model, per allocator at its
kernel block size). With ``sim_to_real.repeat_replays`` every run is served again after the first
pass, and that second run is scored as a prediction of the first (``real_repeat``): the error the
machine's own repeatability leaves, the noise under every profile's. Writes ``sim_to_real.parquet``
(errors per run and profile), ``sim_to_real_requests.parquet`` (measured and predicted latencies
per request), ``real_steps.parquet`` (every step of the runs and the grid, on one wall-clock time
line), ``repeat_split.parquet`` (each run's miss of the grid's price, the part its repeat shows
alike and its own; with a second pass), both fitted profiles, ``plots/sim_to_real*.png|svg`` and
``report.md`` (with the machine's drift).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.config import KvbenchConfig, run_rates, run_workloads
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler, simulate
from kvbench.engine.profiled import (
    PROFILE_TERMS,
    SWAP_TERMS,
    WAKE_TERMS,
    ProfiledCostModel,
    iteration_features,
    wake_features,
)
from kvbench.engine.records import SimulationResult
from kvbench.engine.scheduler import SchedulerLimits
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.fit import abs_pct_errors, fit_terms
from kvbench.tasks.profile.grid import grid_shapes
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import checked_profile, recorded_grid, write_profile
from kvbench.tasks.sim_to_real.real_grid import RealGridPoint, grid_pool_slots, real_grid
from kvbench.tasks.sim_to_real.table import (
    drift_lines,
    error_row,
    extrapolation_column,
    floor_lines,
    peak_kv_in_use_slots,
    repeat_split,
    repeat_split_lines,
    repeat_split_sections,
    request_pairs,
)
from kvbench.tasks.sim_to_real.vllm_grid import interleave
from kvbench.tasks.simulate.experiment import scheduler_limits
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.tasks.simulate.table import requests_frame, summarize
from kvbench.workloads import to_requests, with_arrivals, workload_rows

FIT_SOURCE = "fit_slice"  # fitted on the first workload's real runs
INTERLEAVED_GRID_SOURCE = "interleaved_grid"  # fitted on the grid measured between the runs
# The grid's profile scaled, per slice x rate, by the machine's speed the grid parts measured just
# before and after its runs (``drift_scales``): the same minutes, no step of the runs used.
LOCAL_GRID_SOURCE = "interleaved_grid_local"
GRID_SOURCE = "grid_profile"  # a task=profile file (executor.profile)
# The same requests served again by the real executor after the first pass, as the prediction.
REPEAT_SOURCE = "real_repeat"
GRID_WORKLOAD = "grid"  # the workload label of the grid's steps


@dataclass
class RealRunRecord:
    """One real run (a slice's replay or a grid point): its labels, requests and what it measured.

    Attributes:
        started_unix_s: when the run began (Unix seconds), so every step has a wall-clock time.
        grid_point: the point's index in the grid, -1 for a replay.
        grid_part: the part of the grid it was measured in (part k before the k-th slice x rate,
            the last after them all), -1 for a replay.
        job: a replay's slice x rate, its index in measurement order (grid parts ``job`` and
            ``job + 1`` bracket it), -1 for a grid point.
        repeat: a replay of the second pass (after the first pass and the grid's last part).
    """

    workload: str
    rate: float
    allocator: str
    requests: list[Request]
    result: SimulationResult
    shapes: list[Any]
    idle_before_s: list[float]
    block_size: int
    started_unix_s: float = 0.0
    grid_point: int = -1
    grid_part: int = -1
    job: int = -1
    repeat: bool = False


@dataclass(frozen=True)
class ReplayJob:
    """One slice at one rate: its label, rate and requests (served under every allocator)."""

    workload: str
    rate: float
    requests: list[Request]


def _given_profile(cfg: KvbenchConfig, deployment: Deployment) -> dict[str, Any] | None:
    """``executor.profile``'s file, checked against the run's model and dtype; a warning for each
    setting it was measured under that these runs do not share (device, threads, backends)."""
    if not cfg.executor.profile:
        return None
    document, differences = checked_profile(cfg.executor.profile, deployment,
                                            cfg.executor.decode_backend,
                                            cfg.executor.linear_backend)  # fmt: skip
    for difference in differences:
        print(f"sim_to_real: warning: {cfg.executor.profile} was measured on {difference}: "
              f"its {GRID_SOURCE} rows price another executor than these runs")  # fmt: skip
    return document


def run_sim_to_real(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Serve every slice for real with the grid's parts between them, fit a profile on the grid
    and one on the first slice, predict every run with each; returns the error table."""
    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    # Checked before anything is served: a profile of another model, or of a malformed grid,
    # stops the run at once.
    given_profile = _given_profile(cfg, deployment)
    given_grid = (recorded_grid(given_profile, str(cfg.executor.profile))
                  if given_profile is not None else None)  # fmt: skip
    model = load_real_model(cfg)
    limits = scheduler_limits(cfg, deployment)
    max_model_len = deployment.model.max_model_len
    num_slots = pool_slots(deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks)
    points = real_grid(limits.max_num_seqs, max_model_len)
    runs, grid_runs, repeat_runs = measure_interleaved(
        model, replay_jobs(cfg, max_model_len), points, cfg, limits, num_slots,
        cfg.sim_to_real.repeat_replays)  # fmt: skip
    fit_label = runs[0].workload
    fit_runs = [run for run in runs if run.workload == fit_label]
    profiles = {INTERLEAVED_GRID_SOURCE: fit_on_runs(grid_runs), FIT_SOURCE: fit_on_runs(fit_runs)}
    for source, name in ((INTERLEAVED_GRID_SOURCE, "profile_real_grid.json"),
                         (FIT_SOURCE, f"profile_fitted_on_{fit_label}.json")):  # fmt: skip
        write_profile(output_dir / name, {
            "model": cfg.model.name, "dtype": cfg.model.dtype,
            "kv_dtype": cfg.model.kv_dtype or cfg.model.dtype,
            "fit_workload": GRID_WORKLOAD if source == INTERLEAVED_GRID_SOURCE else fit_label,
            "coefficients": profiles[source]})  # fmt: skip
    scales = drift_scales(grid_runs, profiles[INTERLEAVED_GRID_SOURCE], len(runs_jobs(runs)))
    profiles[LOCAL_GRID_SOURCE] = profiles[INTERLEAVED_GRID_SOURCE]
    if given_profile is not None:
        profiles[GRID_SOURCE] = given_profile["coefficients"]
    table, pairs_table = compare_all(runs, profiles, fit_label, limits, num_slots,
                                     max_model_len, deployment,
                                     {LOCAL_GRID_SOURCE: scales})  # fmt: skip
    interleaved_shapes = [shape for run in grid_runs for shape in run.shapes]
    fitted_shapes = {INTERLEAVED_GRID_SOURCE: interleaved_shapes,
                     LOCAL_GRID_SOURCE: interleaved_shapes,
                     FIT_SOURCE: [shape for run in fit_runs for shape in run.shapes]}  # fmt: skip
    if given_grid is not None:  # a task=profile file: the points its grid timed
        fitted_shapes[GRID_SOURCE] = grid_shapes(given_grid, deployment.model.kv_bytes_per_token)
    table["extrapolated_steps_pct"] = extrapolation_column(
        table, {(run.workload, run.rate, run.allocator): run.shapes for run in runs},
        fitted_shapes, ("workload", "request_rate", "allocator"), "source")  # fmt: skip
    if repeat_runs:
        repeat_table, repeat_pairs = compare_repeats(runs, repeat_runs, deployment)
        table = pd.concat([table, repeat_table], ignore_index=True)
        pairs_table = pd.concat([pairs_table, repeat_pairs], ignore_index=True)
    steps = real_steps_frame(runs + grid_runs + repeat_runs, profiles[FIT_SOURCE],
                             profiles[INTERLEAVED_GRID_SOURCE])  # fmt: skip
    metadata = provenance(raw_cfg)
    write_table(table, output_dir / "sim_to_real.parquet", metadata)
    write_table(pairs_table, output_dir / "sim_to_real_requests.parquet", metadata)
    write_table(steps, output_dir / "real_steps.parquet", metadata)
    split = repeat_split(steps)
    if not split.empty:  # a run with a second pass
        write_table(split, output_dir / "repeat_split.parquet", metadata)
    if cfg.plots:
        _plot(pairs_table, output_dir, cfg.model.name, fit_label)
    lines = error_summary(table) + floor_lines(table, REPEAT_SOURCE)
    drift = drift_lines(steps)
    split_lines = repeat_split_lines(split)
    grid = grid_fit_lines(steps, len(points), len(grid_runs)) + scale_lines(runs, scales)
    print(f"sim-to-real: {len(runs) + len(repeat_runs)} real runs and {len(grid_runs)} grid "
          f"points in {time.perf_counter() - started_s:.0f} s")  # fmt: skip
    print("\n".join(lines + grid + drift + split_lines))
    write_task_report(output_dir, f"{cfg.experiment_name}: profiled simulation vs real runs",
                      raw_cfg, ["## Errors\n\n" + "\n".join(lines),
                                "## The interleaved grid\n\n" + "\n".join(grid),
                                "## Drift of the real executor's step times\n\n"
                                + "\n".join(drift),
                                *repeat_split_sections(split_lines)])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def replay_jobs(cfg: KvbenchConfig, max_model_len: int) -> list[ReplayJob]:
    """Every workload slice x rate of ``cfg``, in order (the first slice is the fit slice)."""
    jobs = []
    for label, workload_cfg in run_workloads(cfg).items():
        rows = workload_rows(workload_cfg, max_model_len)
        for rate in run_rates(cfg, label, workload_cfg):
            arrivals = with_arrivals(rows, dataclasses.replace(workload_cfg, request_rate=rate))
            jobs.append(ReplayJob(label, float(rate), to_requests(arrivals)))
    return jobs


def measure_interleaved(model: Any, jobs: list[ReplayJob], points: list[RealGridPoint],
                        cfg: KvbenchConfig, limits: SchedulerLimits, num_slots: int,
                        repeat_replays: bool = False
                        ) -> tuple[list[RealRunRecord], list[RealRunRecord],
                                   list[RealRunRecord]]:  # fmt: skip
    """The grid's parts and the slices' runs alternately (part 0, every allocator on job 0, part
    1, ..., the last part), so the grid samples the machine before, between and after the runs;
    with ``repeat_replays``, every job's runs once more after the last part (the second pass).
    Each grid point is served by one executor per block size, made once (its pool
    ``grid_pool_slots``); each replay by a fresh one over the experiment's pool, as before.
    Returns the first pass's runs, the grid's and the second pass's."""
    from kvbench.executors.real import RealExecutor

    max_model_len = limits.max_model_len
    grid_executors: dict[int, Any] = {}
    runs: list[RealRunRecord] = []
    grid_runs: list[RealRunRecord] = []
    for part, part_points in enumerate(interleave(points, len(jobs) + 1)):
        for point in part_points:
            if point.block_size not in grid_executors:
                allocator = make_allocator(point.allocator, grid_pool_slots(max_model_len),
                                           point.block_size, max_model_len)  # fmt: skip
                executor = RealExecutor(model, allocator, cfg.executor.decode_backend,
                                        cfg.model.kv_dtype)  # fmt: skip
                executor.warm_up(limits)
                grid_executors[point.block_size] = executor
            record = serve(GRID_WORKLOAD, float("nan"), point.allocator, point.requests(),
                           grid_executors[point.block_size], limits)  # fmt: skip
            grid_runs.append(dataclasses.replace(record, grid_point=points.index(point),
                                                 grid_part=part))  # fmt: skip
        print(f"real: grid part {part}: {len(part_points)} points")
        if part < len(jobs):
            runs += serve_job(model, jobs[part], part, cfg, limits, num_slots)
    repeat_runs = [run for index, job in enumerate(jobs if repeat_replays else [])
                   for run in serve_job(model, job, index, cfg, limits, num_slots,
                                        repeat=True)]  # fmt: skip
    return runs, grid_runs, repeat_runs


def serve_job(model: Any, job: ReplayJob, index: int, cfg: KvbenchConfig,
              limits: SchedulerLimits, num_slots: int, repeat: bool = False
              ) -> list[RealRunRecord]:  # fmt: skip
    """``job``'s requests served under every allocator of ``cfg``, each by a fresh executor over
    the experiment's pool (``index``: the job's place in measurement order)."""
    from kvbench.executors.real import RealExecutor

    runs = []
    for name in cfg.allocators:
        allocator = make_allocator(name, num_slots, cfg.allocator.block_size,
                                   limits.max_model_len)  # fmt: skip
        executor = RealExecutor(model, allocator, cfg.executor.decode_backend, cfg.model.kv_dtype)
        executor.warm_up(limits)
        served = serve(job.workload, job.rate, name, job.requests, executor, limits)
        runs.append(dataclasses.replace(served, job=index, repeat=repeat))
        print(f"real: {job.workload} @ {job.rate:g} req/s, {name}"
              f"{' (repeat)' if repeat else ''}: {len(runs[-1].shapes)} iterations")  # fmt: skip
    return runs


def serve(workload: str, rate: float, allocator_name: str, requests: list[Request],
          executor: Any, limits: SchedulerLimits) -> RealRunRecord:  # fmt: skip
    """``requests`` served by ``executor`` (``run_real``), with the wall-clock time it began."""
    from kvbench.executors.real import run_real

    started_unix_s = time.time()
    served = run_real(requests, Scheduler(limits), executor.allocator, executor)
    return RealRunRecord(workload, rate, allocator_name, requests, served.result, served.shapes,
                         served.idle_before_s, executor.allocator.block_size,
                         started_unix_s)  # fmt: skip


def runs_jobs(runs: list[RealRunRecord]) -> list[tuple[str, float]]:
    """Each replayed slice x rate, in measurement order (index: the runs' ``job``)."""
    jobs: dict[int, tuple[str, float]] = {run.job: (run.workload, run.rate) for run in runs}
    return [jobs[index] for index in sorted(jobs)]


def drift_scales(grid_runs: list[RealRunRecord], coefficients: dict[str, float],
                 num_jobs: int) -> list[float]:  # fmt: skip
    """Per slice x rate (``job``), the median of measured / fitted step time over the grid's
    steps in the parts just before and after it (``job`` and ``job + 1``): how much slower than
    the grid's profile the machine ran in those minutes, from the grid alone."""
    ratios: dict[int, list[float]] = {}
    for run in grid_runs:
        durations = run.result.steps.columns["duration_s"]
        ratios.setdefault(run.grid_part, []).extend(
            duration / priced_s for duration, priced_s in zip(
                durations, priced_steps_s(run, coefficients), strict=True))  # fmt: skip
    return [float(np.median(ratios.get(job, []) + ratios.get(job + 1, [])))
            for job in range(num_jobs)]  # fmt: skip


def scale_coefficients(coefficients: dict[str, float], scale: float) -> dict[str, float]:
    """Every term of ``coefficients`` times ``scale``."""
    return {term: value * scale for term, value in coefficients.items()}


def priced_steps_s(run: RealRunRecord, coefficients: dict[str, float]) -> list[float]:
    """What a profile gives each step of ``run``: its shape's price, and the wake-up after an
    idle wait for the first step after one (as the simulator prices them)."""
    model = ProfiledCostModel(coefficients, run.block_size)
    return [model.iteration_time_s(shape) + model.wake_time_s(idle_s)
            for shape, idle_s in zip(run.shapes, run.idle_before_s, strict=True)]  # fmt: skip


def fit_on_runs(runs: list[RealRunRecord]) -> dict[str, float]:
    """Coefficients fitted on every real iteration of ``runs``, the wake terms with them on the
    steps after an idle wait (swap terms 0: these runs recompute)."""
    features, times = [], []
    for run in runs:
        features += [iteration_features(shape, run.block_size) + wake_features(idle_s)
                     for shape, idle_s in zip(run.shapes, run.idle_before_s,
                                              strict=True)]  # fmt: skip
        times += list(run.result.steps.columns["duration_s"])
    coefficients = fit_terms(features, times, (*PROFILE_TERMS, *WAKE_TERMS))
    coefficients.update(dict.fromkeys(SWAP_TERMS, 0.0))
    return coefficients


def compare_all(runs: list[RealRunRecord], profiles: dict[str, dict[str, float]],
                fit_label: str, limits: Any, num_slots: int, max_model_len: int,
                deployment: Deployment, run_scales: Mapping[str, Sequence[float]] | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Every run predicted under every profile: the error table (one row per profile and run)
    and the per-request pairs. A source in ``run_scales`` has its profile scaled per run by the
    scale of the run's ``job``. A run is held out unless the profile is the fit slice's and the
    run is of that slice (the grid's and a file's profiles saw no slice)."""
    rows_out, pairs_out = [], []
    for source, coefficients in profiles.items():
        scales = (run_scales or {}).get(source)
        for run in runs:
            run_coefficients = (coefficients if scales is None
                                else scale_coefficients(coefficients, scales[run.job]))
            row, pairs = _compare(run, run_coefficients, limits, num_slots, max_model_len,
                                  deployment)  # fmt: skip
            labels = {"source": source, "workload": run.workload, "request_rate": run.rate,
                      "allocator": run.allocator,
                      "held_out": source != FIT_SOURCE or run.workload != fit_label}
            rows_out.append({**labels, **row})
            pairs_out.append(pairs.assign(**labels))
    return pd.DataFrame(rows_out), pd.concat(pairs_out, ignore_index=True)


def compare_repeats(runs: list[RealRunRecord], repeat_runs: list[RealRunRecord],
                    deployment: Deployment) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Each run of the first pass "predicted" by its repeat (same job and allocator): rows and
    pairs as ``compare_all``'s, source ``real_repeat``, held out (the repeat saw no other run)."""
    repeat_of = {(run.job, run.allocator): run for run in repeat_runs}
    rows_out, pairs_out = [], []
    for run in runs:
        row, pairs = compared(run.result, repeat_of[run.job, run.allocator].result, deployment)
        labels = {"source": REPEAT_SOURCE, "workload": run.workload, "request_rate": run.rate,
                  "allocator": run.allocator, "held_out": True}
        rows_out.append({**labels, **row})
        pairs_out.append(pairs.assign(**labels))
    return pd.DataFrame(rows_out), pd.concat(pairs_out, ignore_index=True)


def real_steps_frame(runs: list[RealRunRecord], fit_coefficients: dict[str, float],
                     grid_coefficients: dict[str, float]) -> pd.DataFrame:  # fmt: skip
    """Every step of the runs and the grid, in wall-clock order: its shape, wall-clock time,
    measured time and the time each profile gives it (a profile's error and the machine's drift
    read per step)."""
    rows = []
    for run in runs:
        fitted_s = priced_steps_s(run, fit_coefficients)
        grid_fitted_s = priced_steps_s(run, grid_coefficients)
        columns = run.result.steps.columns
        for index, shape in enumerate(run.shapes):
            start_s = float(columns["time_s"][index])
            rows.append({
                "phase": run_phase(run), "workload": run.workload,
                "request_rate": run.rate, "allocator": run.allocator,
                "block_size": run.block_size, "grid_point": run.grid_point,
                "grid_part": run.grid_part, "step": index, "start_s": start_s,
                "unix_time_s": run.started_unix_s + start_s,
                "duration_s": float(columns["duration_s"][index]),
                "idle_before_s": run.idle_before_s[index],
                "fitted_s": fitted_s[index],
                "grid_fitted_s": grid_fitted_s[index],
                "num_prefill_seqs": shape.num_prefill_seqs,
                "num_prefill_tokens": shape.num_prefill_tokens,
                "prefill_attention_pairs": shape.prefill_attention_pairs,
                "num_decode_tokens": shape.num_decode_tokens,
                "decode_context_tokens": shape.decode_context_tokens,
            })  # fmt: skip
    return pd.DataFrame(rows).sort_values("unix_time_s", kind="stable", ignore_index=True)


def run_phase(run: RealRunRecord) -> str:
    """``grid`` (a grid point), ``replay`` (the first pass) or ``repeat`` (the second pass)."""
    return "grid" if run.grid_part >= 0 else "repeat" if run.repeat else "replay"


def grid_fit_lines(steps: pd.DataFrame, num_points: int, num_grid_runs: int) -> list[str]:
    """How the grid was measured and how well its profile fits its own steps."""
    grid = steps[steps["phase"] == "grid"]
    errors = abs_pct_errors(grid["grid_fitted_s"], grid["duration_s"])
    replays = steps[steps["phase"] != "grid"]
    replay_errors = abs_pct_errors(replays["grid_fitted_s"], replays["duration_s"])
    return [
        f"- {num_points} points served {num_grid_runs} times ({len(grid)} steps, "
        f"{grid['duration_s'].sum():.0f} s of steps) in {grid['grid_part'].nunique()} parts",
        f"- grid profile on its own steps: median |error| {float(pd.Series(errors).median()):.1f} "
        f"%; on the runs' steps (held out): {float(pd.Series(replay_errors).median()):.1f} %",
    ]


def scale_lines(runs: list[RealRunRecord], scales: list[float]) -> list[str]:
    """The drift scale each slice x rate was predicted with under ``interleaved_grid_local``."""
    return [f"- {LOCAL_GRID_SOURCE}: {workload} @ {rate:g} req/s priced x {scale:.3f} (grid "
            f"parts {job} and {job + 1})"
            for job, ((workload, rate), scale) in enumerate(zip(runs_jobs(runs), scales,
                                                               strict=True))]  # fmt: skip


def _plot(pairs_table: pd.DataFrame, output_dir: Path, model_name: str, fit_label: str) -> None:
    """Predicted vs measured E2E per request, one chart per fitted profile."""
    titles = {FIT_SOURCE: ("sim_to_real", f"fit on {fit_label}"),
              INTERLEAVED_GRID_SOURCE: ("sim_to_real_grid", "fit on the interleaved grid")}
    for source, (name, fitted) in titles.items():
        chart = pairs_table[pairs_table["source"] == source].rename(
            columns={"e2e_latency_s_measured": "measured_s", "e2e_latency_s_predicted":
                     "predicted_s"})  # fmt: skip
        plot_predicted_vs_measured(chart, output_dir / "plots", name,
                                   f"E2E latency per request: profiled simulation vs "
                                   f"{model_name} served for real ({fitted})",
                                   group="workload")  # fmt: skip


def _compare(
    run: RealRunRecord,
    coefficients: dict[str, float],
    limits: Any,
    num_slots: int,
    max_model_len: int,
    deployment: Deployment,
) -> tuple[dict[str, float], pd.DataFrame]:
    """The run simulated with ``coefficients``: its error row and per-request pairs."""
    allocator = make_allocator(run.allocator, num_slots, run.block_size, max_model_len)
    predicted = simulate(run.requests, Scheduler(limits), allocator,
                         ProfiledCostModel(coefficients, allocator.block_size))  # fmt: skip
    return compared(run.result, predicted, deployment)


def compared(measured: SimulationResult, predicted: SimulationResult,
             deployment: Deployment) -> tuple[dict[str, float], pd.DataFrame]:  # fmt: skip
    """The error row of ``predicted`` against ``measured`` (the same requests) and the
    per-request pairs."""
    frames = [requests_frame(result) for result in (measured, predicted)]
    figures = []
    for result, requests in zip((measured, predicted), frames, strict=True):
        summary = summarize(requests, result, deployment)
        figures.append({"output_token_throughput": summary["output_token_throughput"],
                        "mean_batch_size": summary["mean_batch_size"],
                        "peak_kv_in_use_slots": float(peak_kv_in_use_slots(result))})  # fmt: skip
    pairs = request_pairs(*frames)
    return error_row(pairs, figures[0], figures[1]), pairs


def error_summary(table: pd.DataFrame) -> list[str]:
    """One line per (profile, workload): medians over its runs of each error."""
    lines = []
    columns = ["e2e_mape_pct", "ttft_mape_pct", "tpot_mape_pct",
               "output_token_throughput_error_pct", "mean_batch_size_error_pct",
               "peak_kv_in_use_slots_error_pct"]  # fmt: skip
    if "extrapolated_steps_pct" in table:
        columns.append("extrapolated_steps_pct")
    grouped = table.groupby(["source", "workload", "held_out"], sort=False)[columns].median()
    for (source, workload, held_out), row in grouped.iterrows():
        beyond = row.get("extrapolated_steps_pct", float("nan"))
        lines.append(
            f"- {source}, {workload} ({'held out' if held_out else 'fit slice'}): median over "
            f"runs of E2E {row['e2e_mape_pct']:.1f} %, TTFT {row['ttft_mape_pct']:.1f} %, "
            f"TPOT {row['tpot_mape_pct']:.1f} % (median |error| per request); throughput "
            f"{row['output_token_throughput_error_pct']:+.1f} %, mean batch "
            f"{row['mean_batch_size_error_pct']:+.1f} %, peak KV in use "
            f"{row['peak_kv_in_use_slots_error_pct']:+.1f} %"
            + ("" if pd.isna(beyond) else f"; steps beyond its fit's range {beyond:.0f} %")
        )
    return lines
