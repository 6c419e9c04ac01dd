"""``python -m kvbench experiment=sim_to_real``: real runs, a profile, predicted runs, errors.

Every workload slice x rate x allocator is served on the real model (``executors.real``). A
profile is fitted on the real iterations of the first workload (the fit slice) and the requests
of every run are simulated with it (``executor=profiled``'s model, per allocator at its kernel
block size); with ``executor.profile=FILE`` the grid profile of ``task=profile`` is evaluated
too. Writes ``sim_to_real.parquet`` (errors per run and profile), ``sim_to_real_requests.parquet``
(measured and predicted latencies per request), the profile file fitted on the slice,
``plots/sim_to_real.png|svg`` and ``report.md``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.config import KvbenchConfig, run_workloads
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler, simulate
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel, iteration_features
from kvbench.engine.records import SimulationResult
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.fit import fit_non_negative
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import read_profile, write_profile
from kvbench.tasks.sim_to_real.table import error_row, peak_kv_in_use_slots, request_pairs
from kvbench.tasks.simulate.experiment import scheduler_limits
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.tasks.simulate.table import requests_frame, summarize
from kvbench.workloads import to_requests, with_arrivals, workload_rows

FIT_SOURCE = "fit_slice"
GRID_SOURCE = "grid_profile"


@dataclass
class RealRunRecord:
    """One real run: its labels, requests and what it measured."""

    workload: str
    rate: float
    allocator: str
    requests: list[Request]
    result: SimulationResult
    shapes: list[Any]
    block_size: int


def run_sim_to_real(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Serve every slice for real, fit on the first, predict all; returns the error table."""
    from kvbench.executors.real import RealExecutor, run_real

    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    model = load_real_model(cfg.model.name, cfg.model.dtype)
    limits = scheduler_limits(cfg, deployment)
    max_model_len = deployment.model.max_model_len
    num_slots = pool_slots(deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks)
    runs: list[RealRunRecord] = []
    for label, workload_cfg in run_workloads(cfg).items():
        rows = workload_rows(workload_cfg, max_model_len)
        rates = cfg.workload_request_rates.get(label) or cfg.request_rates
        for rate in rates or [workload_cfg.request_rate]:
            rate_cfg = dataclasses.replace(workload_cfg, request_rate=rate)
            requests = to_requests(with_arrivals(rows, rate_cfg))
            for name in cfg.allocators:
                allocator = make_allocator(name, num_slots, cfg.allocator.block_size,
                                           max_model_len)  # fmt: skip
                executor = RealExecutor(model, allocator)
                executor.warm_up()
                served = run_real(requests, Scheduler(limits), allocator, executor)
                runs.append(RealRunRecord(label, float(rate), name, requests, served.result,
                                          served.shapes, allocator.block_size))  # fmt: skip
                print(f"real: {label} @ {rate:g} req/s, {name}: {len(served.shapes)} "
                      "iterations")  # fmt: skip
    fit_label = next(iter(run_workloads(cfg)))
    profiles = {FIT_SOURCE: _fit_on(runs, fit_label)}
    write_profile(output_dir / f"profile_fitted_on_{fit_label}.json",
                  {"model": cfg.model.name, "dtype": cfg.model.dtype, "fit_workload": fit_label,
                   "coefficients": profiles[FIT_SOURCE]})  # fmt: skip
    if cfg.executor.profile:
        profiles[GRID_SOURCE] = read_profile(cfg.executor.profile)["coefficients"]
    rows_out, pairs_out = [], []
    for source, coefficients in profiles.items():
        for run in runs:
            row, pairs = _compare(run, coefficients, limits, num_slots, max_model_len,
                                  deployment)  # fmt: skip
            labels = {"source": source, "workload": run.workload, "request_rate": run.rate,
                      "allocator": run.allocator, "held_out": run.workload != fit_label}
            rows_out.append({**labels, **row})
            pairs_out.append(pairs.assign(**labels))
    table = pd.DataFrame(rows_out)
    metadata = provenance(raw_cfg)
    write_table(table, output_dir / "sim_to_real.parquet", metadata)
    pairs_table = pd.concat(pairs_out, ignore_index=True)
    write_table(pairs_table, output_dir / "sim_to_real_requests.parquet", metadata)
    if cfg.plots:
        chart = pairs_table[pairs_table["source"] == FIT_SOURCE].rename(
            columns={"e2e_latency_s_measured": "measured_s", "e2e_latency_s_predicted":
                     "predicted_s"})  # fmt: skip
        plot_predicted_vs_measured(chart, output_dir / "plots", "sim_to_real",
                                   f"E2E latency per request: profiled simulation vs "
                                   f"{cfg.model.name} served for real (fit on {fit_label})",
                                   group="workload")  # fmt: skip
    lines = error_summary(table)
    print(f"sim-to-real: {len(runs)} real runs in {time.perf_counter() - started_s:.0f} s")
    print("\n".join(lines))
    write_task_report(output_dir, f"{cfg.experiment_name}: profiled simulation vs real runs",
                      raw_cfg, ["## Errors\n\n" + "\n".join(lines)])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def _fit_on(runs: list[RealRunRecord], label: str) -> dict[str, float]:
    """Coefficients fitted on every real iteration of the workload ``label``'s runs (swap terms
    0: these runs recompute)."""
    features, times = [], []
    for run in runs:
        if run.workload != label:
            continue
        features += [iteration_features(shape, run.block_size) for shape in run.shapes]
        times += list(run.result.steps.columns["duration_s"])
    fitted = fit_non_negative(features, times)
    coefficients = dict(zip(PROFILE_TERMS, map(float, fitted), strict=True))
    coefficients.update(dict.fromkeys(SWAP_TERMS, 0.0))
    return coefficients


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
    measured_requests = requests_frame(run.result)
    predicted_requests = requests_frame(predicted)
    figures = []
    for result, requests in ((run.result, measured_requests), (predicted, predicted_requests)):
        summary = summarize(requests, result, deployment)
        figures.append({"output_token_throughput": summary["output_token_throughput"],
                        "mean_batch_size": summary["mean_batch_size"],
                        "peak_kv_in_use_slots": float(peak_kv_in_use_slots(result))})  # fmt: skip
    pairs = request_pairs(measured_requests, predicted_requests)
    return error_row(pairs, figures[0], figures[1]), pairs


def error_summary(table: pd.DataFrame) -> list[str]:
    """One line per (profile, workload): medians over its runs of each error."""
    lines = []
    columns = ["e2e_mape_pct", "ttft_mape_pct", "tpot_mape_pct",
               "output_token_throughput_error_pct", "mean_batch_size_error_pct",
               "peak_kv_in_use_slots_error_pct"]  # fmt: skip
    grouped = table.groupby(["source", "workload", "held_out"], sort=False)[columns].median()
    for (source, workload, held_out), row in grouped.iterrows():
        lines.append(
            f"- {source}, {workload} ({'held out' if held_out else 'fit slice'}): median over "
            f"runs of E2E {row['e2e_mape_pct']:.1f} %, TTFT {row['ttft_mape_pct']:.1f} %, "
            f"TPOT {row['tpot_mape_pct']:.1f} % (median |error| per request); throughput "
            f"{row['output_token_throughput_error_pct']:+.1f} %, mean batch "
            f"{row['mean_batch_size_error_pct']:+.1f} %, peak KV in use "
            f"{row['peak_kv_in_use_slots_error_pct']:+.1f} %"
        )
    return lines
