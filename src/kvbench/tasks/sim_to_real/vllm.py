"""``python -m kvbench experiment=sim_to_vllm``: kvbench's vLLM v1 model against real vLLM.

Real vLLM (``referee.vllm_engine``: vLLM's own engine on this CPU, serving the model of ``model``)
replays every workload slice x rate on the wall clock, and between the replays serves the closed
batches of a grid of controlled shapes (``vllm_grid``): the grid is dealt into parts measured
before, between and after the replays, so slow drift of the machine shows in the grid and the
replays alike. Two profiles are fitted on vLLM's own step times (each step priced by the shape
vLLM's scheduler gave it: its prefill chunks with their context, prefix hits included, and its
decode tokens): one on the grid's steps (every slice is then held out), one on the first slice's
replays. kvbench's ``scheduler=vllm_v1`` model simulates every replay's requests priced by each.
With ``sim_to_vllm.repeat_replays`` every replay is served again after the first pass, and that
second replay is scored as a prediction of the first (``vllm_repeat``): vLLM against itself, the
noise under every profile's error. Errors per request (E2E, TTFT, TPOT) and per run (throughput,
mean batch, peak KV slots in use) go to ``sim_to_vllm.parquet`` and
``sim_to_vllm_requests.parquet``, every vLLM step (with its wall-clock time) to
``vllm_steps.parquet``, each replay's miss of the grid's price split against its repeat's to
``repeat_split.parquet``, beside ``plots/sim_to_vllm`` and both profiles.

Then the fair-instrument check (``fair_instrument``): one closed batch served by vLLM and by
kvbench's own real executor, output tokens/s of each, and both profiled.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.config import KvbenchConfig
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine.kv_cache_v1 import V1KVCache
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel, iteration_features
from kvbench.engine.simulate_v1 import simulate_v1
from kvbench.referee.vllm_engine import (
    EngineRun,
    EngineSettings,
    EngineStep,
    VllmEngine,
    replay,
    run_waves,
    start_vllm,
)
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.fit import fit_terms
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import write_profile
from kvbench.tasks.sim_to_real.fair_instrument import fair_instrument, fair_summary, profile_tables
from kvbench.tasks.sim_to_real.run import ReplayJob, error_summary, replay_jobs
from kvbench.tasks.sim_to_real.table import (
    drift_lines,
    error_row,
    extrapolation_column,
    floor_lines,
    repeat_split,
    repeat_split_lines,
    repeat_split_sections,
    request_pairs,
)
from kvbench.tasks.sim_to_real.vllm_grid import VllmGridPoint, interleave, vllm_grid
from kvbench.tasks.simulate.experiment import scheduler_limits, v1_limits
from kvbench.tasks.simulate.real_runner import pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.tasks.simulate.table import add_request_latencies, requests_frame

# The profiles: fitted on the grid's steps, or on the first slice's replays (``SOURCES``' keys).
GRID_PROFILE = "grid"
SOURCES = {GRID_PROFILE: "vllm_grid", "fit_slice": "vllm_fit_slice"}
REPEAT_SOURCE = "vllm_repeat"  # the same requests replayed on vLLM again, as the prediction
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass
class VllmRunRecord:
    """One replay on real vLLM: its labels, requests and what vLLM did (``repeat``: a replay of
    the second pass)."""

    workload: str
    rate: float
    requests: list[Request]
    run: EngineRun
    repeat: bool = False


@dataclasses.dataclass
class GridRun:
    """One grid point served on real vLLM: the point, the part of the grid it was measured in
    (parts alternate with the replays) and what vLLM did."""

    point_index: int
    part: int
    point: VllmGridPoint
    run: EngineRun


def engine_settings(cfg: KvbenchConfig, deployment: Deployment, model_dir: Path) -> EngineSettings:
    """vLLM started as ``cfg`` describes kvbench's ``vllm_v1`` run: the same pool in blocks, block
    size, limits, prefix caching (on for ``paged_prefix``) and K/V dtype (``model.kv_dtype=fp8``:
    vLLM's ``kv_cache_dtype=fp8``, e4m3 at unit scales as kvbench's)."""
    limits = scheduler_limits(cfg, deployment)
    num_gpu_blocks = cfg.allocator.num_gpu_blocks
    assert num_gpu_blocks is not None  # config validation requires it for this task
    return EngineSettings(
        model_dir=model_dir,
        num_gpu_blocks=num_gpu_blocks,
        block_size=cfg.allocator.block_size,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=limits.max_model_len,
        enable_prefix_caching=cfg.allocators[0] == "paged_prefix",
        dtype=DTYPES[cfg.model.dtype],
        kv_cache_dtype="fp8" if cfg.model.kv_dtype == "fp8" else "auto",
    )


def run_sim_to_vllm(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Replay every slice on real vLLM with the grid's parts between the replays, fit a profile
    on the grid and one on the first slice, predict every replay with kvbench's vLLM v1 model
    priced by each; then the fair-instrument batch. Returns the error table."""
    from kvbench.tasks.equivalence.models import smollm2_model_dir

    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    settings = engine_settings(cfg, deployment, smollm2_model_dir())
    engine = start_vllm(settings)
    print(f"vllm: engine started in {engine.startup_s:.0f} s")
    runs, grid_runs, repeat_runs = measure_interleaved(
        engine, replay_jobs(cfg, deployment.model.max_model_len), grid_points(settings),
        cfg.sim_to_vllm.repeat_replays)  # fmt: skip
    fit_label = runs[0].workload
    block_size = cfg.allocator.block_size
    fitted_steps = {GRID_PROFILE: grid_steps(grid_runs),
                    fit_label: [step for run in runs if run.workload == fit_label
                                for step in run.run.steps]}  # fmt: skip
    profiles = {name: fit_on_vllm_steps(steps, block_size) for name, steps in fitted_steps.items()}
    for name, coefficients in profiles.items():
        file_name = "profile_vllm_grid.json" if name == GRID_PROFILE else \
            f"profile_vllm_fitted_on_{name}.json"
        write_profile(output_dir / file_name,
                      {"model": cfg.model.name, "dtype": cfg.model.dtype,
                       "kv_dtype": cfg.model.kv_dtype or cfg.model.dtype, "fit_workload": name,
                       "engine": "vllm", "coefficients": coefficients})  # fmt: skip
    table, pairs_table = compare_all(runs, profiles, cfg, deployment)
    table["extrapolated_steps_pct"] = extrapolation_column(
        table, {(run.workload, run.rate): [step.shape for step in run.run.steps] for run in runs},
        {name: [step.shape for step in steps] for name, steps in fitted_steps.items()},
        ("workload", "request_rate"), "profile")  # fmt: skip
    if repeat_runs:
        repeat_table, repeat_pairs = compare_repeats(runs, repeat_runs, cfg)
        table = pd.concat([table, repeat_table], ignore_index=True)
        pairs_table = pd.concat([pairs_table, repeat_pairs], ignore_index=True)
    metadata = provenance(raw_cfg)
    write_table(table, output_dir / "sim_to_vllm.parquet", metadata)
    write_table(pairs_table, output_dir / "sim_to_vllm_requests.parquet", metadata)
    steps = vllm_steps_frame(runs + repeat_runs, grid_runs, profiles[GRID_PROFILE],
                             profiles[fit_label],
                             block_size)  # fmt: skip
    write_table(steps, output_dir / "vllm_steps.parquet", metadata)
    split = repeat_split(steps)
    if not split.empty:  # a run with a second pass
        write_table(split, output_dir / "repeat_split.parquet", metadata)
    fair = fair_instrument(cfg, deployment, engine)
    write_table(fair.throughput, output_dir / "fair_instrument.parquet", metadata)
    write_table(fair.profile, output_dir / "fair_profile.parquet", metadata)
    if cfg.plots:
        chart = pairs_table.rename(columns={"e2e_latency_s_measured": "measured_s",
                                            "e2e_latency_s_predicted": "predicted_s"})
        for name in profiles:
            plot_predicted_vs_measured(
                chart[chart["profile"] == name], output_dir / "plots", f"sim_to_vllm_{name}",
                f"E2E latency per request: kvbench's vllm_v1 model, profiled on vLLM's steps "
                f"of {'its grid' if name == GRID_PROFILE else name}, vs real vLLM",
                group="workload")  # fmt: skip
    lines = error_summary(table) + floor_lines(table, REPEAT_SOURCE)
    drift = drift_lines(steps)
    split_lines = repeat_split_lines(split)
    fair_lines = fair_summary(fair.throughput)
    print(f"sim-to-vllm: {len(runs) + len(repeat_runs)} replays and {len(grid_runs)} grid "
          f"points on vLLM in {time.perf_counter() - started_s:.0f} s")  # fmt: skip
    print("\n".join(lines + drift + split_lines + fair_lines))
    write_task_report(output_dir, f"{cfg.experiment_name}: kvbench's vLLM v1 model vs real vLLM",
                      raw_cfg, ["## Errors\n\n" + "\n".join(lines),
                                "## Drift of vLLM's step times\n\n" + "\n".join(drift),
                                *repeat_split_sections(split_lines),
                                "## Fair instrument\n\n" + "\n".join(fair_lines)
                                + "\n\n" + profile_tables(fair.profile)])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def grid_points(settings: EngineSettings) -> list[VllmGridPoint]:
    """The grid the engine of ``settings`` can hold at once (its pool less the null block)."""
    return vllm_grid(settings.num_gpu_blocks - 1, settings.block_size, settings.max_num_seqs,
                     settings.max_num_batched_tokens, settings.max_model_len)  # fmt: skip


def measure_interleaved(engine: VllmEngine, jobs: list[ReplayJob], points: list[VllmGridPoint],
                        repeat_replays: bool = False
                        ) -> tuple[list[VllmRunRecord], list[GridRun],
                                   list[VllmRunRecord]]:  # fmt: skip
    """The grid's parts and the replays alternately (part 0, replay 0, part 1, ..., the last
    part), so the grid samples the machine before, between and after the replays; with
    ``repeat_replays``, every replay once more after the last part (the second pass). Returns
    the first pass's replays, the grid's runs and the second pass's replays."""
    parts = interleave(points, len(jobs) + 1)
    index_of = {point: index for index, point in enumerate(points)}
    runs: list[VllmRunRecord] = []
    grid_runs: list[GridRun] = []
    for part, part_points in enumerate(parts):
        for point in part_points:
            grid_runs.append(GridRun(index_of[point], part, point,
                                     run_waves(engine, point.waves(0))))  # fmt: skip
        print(f"vllm: grid part {part}: {len(part_points)} points")
        if part < len(jobs):
            runs.append(replay_job(engine, jobs[part]))
    repeat_runs = [replay_job(engine, job, repeat=True) for job in jobs if repeat_replays]
    return runs, grid_runs, repeat_runs


def replay_job(engine: VllmEngine, job: ReplayJob, repeat: bool = False) -> VllmRunRecord:
    """``job``'s requests replayed on ``engine`` (its prefix cache emptied first)."""
    run = replay(engine, job.requests)
    print(f"vllm: {job.workload} @ {job.rate:g} req/s{' (repeat)' if repeat else ''}: "
          f"{len(run.steps)} steps")  # fmt: skip
    return VllmRunRecord(job.workload, job.rate, job.requests, run, repeat)


def grid_steps(grid_runs: list[GridRun]) -> list[EngineStep]:
    """Every step the grid's points ran."""
    return [step for grid_run in grid_runs for step in grid_run.run.steps]


def fit_on_vllm_steps(steps: list[EngineStep], block_size: int) -> dict[str, float]:
    """Profile coefficients fitted on ``steps`` (vLLM's measured step times against the features
    of the shapes it scheduled; swap terms 0: vLLM v1 recomputes)."""
    features = [iteration_features(step.shape, block_size) for step in steps]
    times_s = [step.duration_s for step in steps]
    coefficients = fit_terms(features, times_s, PROFILE_TERMS)
    coefficients.update(dict.fromkeys(SWAP_TERMS, 0.0))
    return coefficients


def compare_all(runs: list[VllmRunRecord], profiles: dict[str, dict[str, float]],
                cfg: KvbenchConfig, deployment: Deployment
                ) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Every replay predicted under every profile: the error table (one row per profile and
    replay) and the per-request pairs. A replay is held out unless it is of the slice the
    profile was fitted on."""
    rows, pairs = [], []
    for name, coefficients in profiles.items():
        source = SOURCES[GRID_PROFILE if name == GRID_PROFILE else "fit_slice"]
        for run in runs:
            row, run_pairs = compare_with_vllm(run, coefficients, cfg, deployment)
            labels = {"source": source, "profile": name, "workload": run.workload,
                      "request_rate": run.rate, "allocator": cfg.allocators[0],
                      "held_out": run.workload != name}  # fmt: skip
            rows.append({**labels, **row})
            pairs.append(run_pairs.assign(**labels))
    return pd.DataFrame(rows), pd.concat(pairs, ignore_index=True)


def compare_repeats(runs: list[VllmRunRecord], repeat_runs: list[VllmRunRecord],
                    cfg: KvbenchConfig) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """Each replay of the first pass "predicted" by its repeat (the same slice x rate): rows and
    pairs as ``compare_all``'s, source ``vllm_repeat``, held out (the repeat saw no other run)."""
    block_size = cfg.allocator.block_size
    repeat_of = {(run.workload, run.rate): run for run in repeat_runs}
    rows, pairs = [], []
    for run in runs:
        repeat = repeat_of[run.workload, run.rate]
        measured, again = measured_requests(run), measured_requests(repeat)
        figures = [vllm_run_figures(requests, record, block_size)
                   for requests, record in ((measured, run), (again, repeat))]  # fmt: skip
        run_pairs = request_pairs(measured, again)
        labels = {"source": REPEAT_SOURCE, "profile": "", "workload": run.workload,
                  "request_rate": run.rate, "allocator": cfg.allocators[0], "held_out": True}
        rows.append({**labels, **error_row(run_pairs, figures[0], figures[1])})
        pairs.append(run_pairs.assign(**labels))
    return pd.DataFrame(rows), pd.concat(pairs, ignore_index=True)


def vllm_steps_frame(runs: list[VllmRunRecord], grid_runs: list[GridRun],
                     grid_coefficients: dict[str, float], fit_coefficients: dict[str, float],
                     block_size: int) -> pd.DataFrame:  # fmt: skip
    """Every vLLM step of the replays and the grid: its shape, wall-clock time, measured time, and
    the time each profile gives it (so a profile's error, and the machine's drift, can be read
    per step)."""
    grid_model = ProfiledCostModel(grid_coefficients, block_size)
    fit_model = ProfiledCostModel(fit_coefficients, block_size)
    labelled = [({"phase": "repeat" if run.repeat else "replay", "workload": run.workload,
                  "request_rate": run.rate, "grid_point": -1, "grid_part": -1}, run.run)
                 for run in runs]  # fmt: skip
    labelled += [({"phase": "grid", "workload": GRID_PROFILE, "request_rate": float("nan"),
                   "grid_point": grid_run.point_index, "grid_part": grid_run.part}, grid_run.run)
                 for grid_run in grid_runs]  # fmt: skip
    frame = pd.DataFrame([
        {**labels, "step": index, "start_s": step.start_s,
         "unix_time_s": run.started_unix_s + step.start_s, "duration_s": step.duration_s,
         "fitted_s": fit_model.iteration_time_s(step.shape),
         "grid_fitted_s": grid_model.iteration_time_s(step.shape),
         "num_prefill_seqs": step.shape.num_prefill_seqs,
         "num_prefill_tokens": step.shape.num_prefill_tokens,
         "prefill_attention_pairs": step.shape.prefill_attention_pairs,
         "num_decode_tokens": step.shape.num_decode_tokens,
         "decode_context_tokens": step.shape.decode_context_tokens,
         "num_blocks_in_use": step.num_blocks_in_use}
        for labels, run in labelled for index, step in enumerate(run.steps)
    ])  # fmt: skip
    return frame.sort_values("unix_time_s", kind="stable", ignore_index=True)


def measured_requests(run: VllmRunRecord) -> pd.DataFrame:
    """vLLM's request times as kvbench's requests table has them, from each request's trace
    arrival (a request that arrived during a step waited for it, as a user would)."""
    arrival_s = {request.request_id: request.arrival_s for request in run.requests}
    frame = pd.DataFrame({
        "request_id": [times.request_id for times in run.run.requests],
        "arrival_s": [arrival_s[times.request_id] for times in run.run.requests],
        "first_token_s": [times.first_token_s for times in run.run.requests],
        "finish_s": [times.finish_s for times in run.run.requests],
        "output_tokens": [times.num_output_tokens for times in run.run.requests],
        "status": "finished",
    })  # fmt: skip
    return add_request_latencies(frame)


def compare_with_vllm(
    run: VllmRunRecord, coefficients: dict[str, float], cfg: KvbenchConfig, deployment: Deployment
) -> tuple[dict[str, float], pd.DataFrame]:
    """The run's requests through kvbench's ``vllm_v1`` model priced with ``coefficients``: its
    error row against vLLM and the per-request pairs."""
    limits = scheduler_limits(cfg, deployment)
    block_size = cfg.allocator.block_size
    num_slots = pool_slots(deployment, block_size, cfg.allocator.num_gpu_blocks)
    memory = V1KVCache(num_slots // block_size, block_size, limits.max_model_len,
                       enable_caching=cfg.allocators[0] == "paged_prefix", num_slots=num_slots)
    # vLLM's CPU platform schedules synchronously, whatever scheduler.async_scheduling says.
    predicted = simulate_v1(run.requests, memory, v1_limits(limits, async_scheduling=False),
                            ProfiledCostModel(coefficients, block_size), num_slots)  # fmt: skip
    measured = measured_requests(run)
    predicted_requests = requests_frame(predicted)
    steps = predicted.steps.columns
    figures = [
        vllm_run_figures(measured, run, block_size),
        _run_figures(predicted_requests, steps["batch_size"], steps["num_blocks_in_use"],
                     block_size),
    ]  # fmt: skip
    pairs = request_pairs(measured, predicted_requests)
    return error_row(pairs, figures[0], figures[1]), pairs


def vllm_run_figures(requests: pd.DataFrame, run: VllmRunRecord,
                     block_size: int) -> dict[str, float]:  # fmt: skip
    """``_run_figures`` of a replay on vLLM (``requests``: its ``measured_requests``)."""
    return _run_figures(requests, [len(step.scheduled_tokens) for step in run.run.steps],
                        [step.num_blocks_in_use for step in run.run.steps], block_size)


def _run_figures(requests: pd.DataFrame, batch_sizes: Any, blocks_in_use: Any,
                 block_size: int) -> dict[str, float]:  # fmt: skip
    """Output tokens/s (from the first arrival to the last finish), mean batch per step, and the
    most KV slots in use (blocks x block size), computed alike for vLLM and kvbench."""
    finished = requests[requests["status"] == "finished"]
    span_s = float(finished["finish_s"].max() - requests["arrival_s"].min())
    output_tokens = float(finished["output_tokens"].sum())
    return {
        "output_token_throughput": output_tokens / span_s if span_s > 0 else float("nan"),
        "mean_batch_size": float(np.mean(batch_sizes)) if len(batch_sizes) else 0.0,
        "peak_kv_in_use_slots": float(np.max(blocks_in_use)) * block_size if len(blocks_in_use)
        else 0.0,
    }
