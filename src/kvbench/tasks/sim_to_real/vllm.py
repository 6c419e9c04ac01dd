"""``python -m kvbench experiment=sim_to_vllm``: kvbench's vLLM v1 model against real vLLM.

Real vLLM (``referee.vllm_engine``: vLLM's own engine on this CPU, serving the model of
``model``) replays every workload slice x rate on the wall clock. A profile is fitted on vLLM's
own step times of the first slice (each step priced by the shape vLLM's scheduler gave it: its
prefill chunks with their context, prefix hits included, and its decode tokens), and kvbench's
``scheduler=vllm_v1`` model simulates every run's requests with it. Errors per request (E2E,
TTFT, TPOT) and per run (throughput, mean batch, peak blocks in use) go to ``sim_to_vllm.parquet``
and ``sim_to_vllm_requests.parquet``, every vLLM step to ``vllm_steps.parquet``, beside
``plots/sim_to_vllm`` and the fitted profile.

Then the fair-instrument check: one closed batch (``sim_to_vllm.fair_*``: every request at t = 0,
the same lengths) served by vLLM and by kvbench's own real executor (``executor=real``'s
``paged``), output tokens/s of each in one run (``fair_instrument.parquet``), and where kvbench's
executor spends its time (a cProfile of its run, in ``report.md``).
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.config import KvbenchConfig, run_workloads
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler
from kvbench.engine.kv_cache_v1 import V1KVCache
from kvbench.engine.profiled import PROFILE_TERMS, SWAP_TERMS, ProfiledCostModel, iteration_features
from kvbench.engine.simulate_v1 import simulate_v1
from kvbench.referee.vllm_engine import EngineRun, EngineSettings, VllmEngine, replay, start_vllm
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.profile.fit import fit_non_negative
from kvbench.tasks.profile.plot import plot_predicted_vs_measured
from kvbench.tasks.profile.profile_file import write_profile
from kvbench.tasks.sim_to_real.run import error_summary
from kvbench.tasks.sim_to_real.table import error_row, request_pairs
from kvbench.tasks.simulate.experiment import scheduler_limits, v1_limits
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.tasks.simulate.table import add_request_latencies, requests_frame
from kvbench.workloads import to_requests, with_arrivals, workload_rows

SOURCE = "vllm_fit_slice"
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Functions of kvbench's executor run shown in the report (by their own time).
NUM_PROFILED_FUNCTIONS = 12


@dataclasses.dataclass
class VllmRunRecord:
    """One replay on real vLLM: its labels, requests and what vLLM did."""

    workload: str
    rate: float
    requests: list[Request]
    run: EngineRun


def engine_settings(cfg: KvbenchConfig, deployment: Deployment, model_dir: Path) -> EngineSettings:
    """vLLM started as ``cfg`` describes kvbench's ``vllm_v1`` run: the same pool in blocks, block
    size, limits and prefix caching (on for ``paged_prefix``)."""
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
    )


def run_sim_to_vllm(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Replay every slice on real vLLM, fit on the first, predict all with kvbench's vLLM v1
    model; then the fair-instrument batch. Returns the error table."""
    from kvbench.tasks.equivalence.models import smollm2_model_dir

    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    engine = start_vllm(engine_settings(cfg, deployment, smollm2_model_dir()))
    print(f"vllm: engine started in {engine.startup_s:.0f} s")
    runs = _replay_slices(cfg, deployment, engine)
    fit_label = runs[0].workload
    coefficients = fit_on_vllm_steps([run for run in runs if run.workload == fit_label],
                                     cfg.allocator.block_size)  # fmt: skip
    write_profile(output_dir / f"profile_vllm_fitted_on_{fit_label}.json",
                  {"model": cfg.model.name, "dtype": cfg.model.dtype, "fit_workload": fit_label,
                   "engine": "vllm", "coefficients": coefficients})  # fmt: skip
    rows, pairs = [], []
    for run in runs:
        row, run_pairs = compare_with_vllm(run, coefficients, cfg, deployment)
        labels = {"source": SOURCE, "workload": run.workload, "request_rate": run.rate,
                  "allocator": cfg.allocators[0], "held_out": run.workload != fit_label}
        rows.append({**labels, **row})
        pairs.append(run_pairs.assign(**labels))
    table = pd.DataFrame(rows)
    metadata = provenance(raw_cfg)
    write_table(table, output_dir / "sim_to_vllm.parquet", metadata)
    pairs_table = pd.concat(pairs, ignore_index=True)
    write_table(pairs_table, output_dir / "sim_to_vllm_requests.parquet", metadata)
    write_table(vllm_steps_frame(runs, coefficients, cfg.allocator.block_size),
                output_dir / "vllm_steps.parquet", metadata)  # fmt: skip
    fair, profile_text = fair_instrument(cfg, deployment, engine)
    write_table(fair, output_dir / "fair_instrument.parquet", metadata)
    if cfg.plots:
        chart = pairs_table.rename(columns={"e2e_latency_s_measured": "measured_s",
                                            "e2e_latency_s_predicted": "predicted_s"})
        plot_predicted_vs_measured(chart, output_dir / "plots", "sim_to_vllm",
                                   f"E2E latency per request: kvbench's vllm_v1 model, profiled "
                                   f"on vLLM's steps of {fit_label}, vs real vLLM",
                                   group="workload")  # fmt: skip
    lines = error_summary(table)
    fair_lines = fair_summary(fair)
    print(f"sim-to-vllm: {len(runs)} replays on vLLM in {time.perf_counter() - started_s:.0f} s")
    print("\n".join(lines + fair_lines))
    write_task_report(output_dir, f"{cfg.experiment_name}: kvbench's vLLM v1 model vs real vLLM",
                      raw_cfg, ["## Errors\n\n" + "\n".join(lines),
                                "## Fair instrument\n\n" + "\n".join(fair_lines)
                                + "\n\nkvbench's executor, by own time:\n\n```\n" + profile_text
                                + "```\n"])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def _replay_slices(cfg: KvbenchConfig, deployment: Deployment,
                   engine: VllmEngine) -> list[VllmRunRecord]:  # fmt: skip
    runs = []
    for label, workload_cfg in run_workloads(cfg).items():
        rows = workload_rows(workload_cfg, deployment.model.max_model_len)
        rates = cfg.workload_request_rates.get(label) or cfg.request_rates
        for rate in rates or [workload_cfg.request_rate]:
            requests = to_requests(with_arrivals(rows, dataclasses.replace(workload_cfg,
                                                                           request_rate=rate)))
            run = replay(engine, requests)
            runs.append(VllmRunRecord(label, float(rate), requests, run))
            print(f"vllm: {label} @ {rate:g} req/s: {len(run.steps)} steps")
    return runs


def fit_on_vllm_steps(runs: list[VllmRunRecord], block_size: int) -> dict[str, float]:
    """Profile coefficients fitted on every step of ``runs`` (vLLM's measured step times against
    the features of the shapes it scheduled; swap terms 0: vLLM v1 recomputes)."""
    steps = [step for run in runs for step in run.run.steps]
    features = [iteration_features(step.shape, block_size) for step in steps]
    times_s = [step.duration_s for step in steps]
    fitted = fit_non_negative(features, times_s)
    coefficients = dict(zip(PROFILE_TERMS, map(float, fitted), strict=True))
    coefficients.update(dict.fromkeys(SWAP_TERMS, 0.0))
    return coefficients


def vllm_steps_frame(runs: list[VllmRunRecord], coefficients: dict[str, float],
                     block_size: int) -> pd.DataFrame:  # fmt: skip
    """Every vLLM step of ``runs``: its shape, measured time, and the time the fitted profile
    gives it (so a profile's error can be read per step and slice)."""
    model = ProfiledCostModel(coefficients, block_size)
    return pd.DataFrame([
        {"workload": run.workload, "request_rate": run.rate, "step": index,
         "start_s": step.start_s, "duration_s": step.duration_s,
         "fitted_s": model.iteration_time_s(step.shape),
         "num_prefill_seqs": step.shape.num_prefill_seqs,
         "num_prefill_tokens": step.shape.num_prefill_tokens,
         "prefill_attention_pairs": step.shape.prefill_attention_pairs,
         "num_decode_tokens": step.shape.num_decode_tokens,
         "decode_context_tokens": step.shape.decode_context_tokens,
         "num_blocks_in_use": step.num_blocks_in_use}
        for run in runs for index, step in enumerate(run.run.steps)
    ])  # fmt: skip


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
    predicted = simulate_v1(run.requests, memory, v1_limits(limits),
                            ProfiledCostModel(coefficients, block_size), num_slots)  # fmt: skip
    measured = measured_requests(run)
    predicted_requests = requests_frame(predicted)
    steps = predicted.steps.columns
    figures = [
        _run_figures(measured, [len(step.scheduled_tokens) for step in run.run.steps],
                     [step.num_blocks_in_use for step in run.run.steps], block_size),
        _run_figures(predicted_requests, steps["batch_size"], steps["num_blocks_in_use"],
                     block_size),
    ]  # fmt: skip
    pairs = request_pairs(measured, predicted_requests)
    return error_row(pairs, figures[0], figures[1]), pairs


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


def fair_requests(cfg: KvbenchConfig) -> list[Request]:
    """The fair-instrument batch: ``sim_to_vllm.fair_num_requests`` requests, all at t = 0, of
    ``fair_prompt_tokens`` + ``fair_output_tokens`` (distinct prompts: no prefix to share)."""
    fair = cfg.sim_to_vllm
    return [Request(request_id, 0.0, fair.fair_prompt_tokens, fair.fair_output_tokens)
            for request_id in range(fair.fair_num_requests)]  # fmt: skip


def fair_instrument(
    cfg: KvbenchConfig, deployment: Deployment, engine: VllmEngine
) -> tuple[pd.DataFrame, str]:
    """The same closed batch served by vLLM and by kvbench's real executor (``paged`` over
    ``scheduler=vllm_v0``'s batches, the same ``max_num_seqs``): output tokens/s, steps and the
    median decode step of each, measured one after the other; and a cProfile of kvbench's run."""
    import torch

    from kvbench.executors.real import RealExecutor, run_real

    requests = fair_requests(cfg)
    output_tokens = sum(request.output_tokens for request in requests)
    vllm_threads = torch.get_num_threads()  # as vLLM's CPU worker left them
    vllm_run = replay(engine, requests)
    vllm_span_s = max(times.finish_s for times in vllm_run.requests)
    vllm_decode_s = [step.duration_s for step in vllm_run.steps if step.num_prefill_tokens == 0]
    model = load_real_model(cfg.model.name, cfg.model.dtype)
    block_size = cfg.allocator.block_size
    num_slots = pool_slots(deployment, block_size, cfg.allocator.num_gpu_blocks)
    allocator = make_allocator("paged", num_slots, block_size, deployment.model.max_model_len)
    executor = RealExecutor(model, allocator)
    pin_threads(cfg.executor.num_threads)  # vLLM's worker may have set its own
    kvbench_threads = torch.get_num_threads()
    executor.warm_up()
    limits = dataclasses.replace(scheduler_limits(cfg, deployment), preemption="recompute")
    profiler = cProfile.Profile()
    profiler.enable()
    served = run_real(requests, Scheduler(limits), allocator, executor)
    profiler.disable()
    kvbench_span_s = max(record.finish_s for record in served.result.requests)
    durations = served.result.steps.columns["duration_s"]
    prefills = served.result.steps.columns["num_prefill_tokens"]
    kvbench_decode_s = [d for d, p in zip(durations, prefills, strict=True) if p == 0]
    rows = [
        {"engine": "vllm", "num_requests": len(requests), "output_tokens": output_tokens,
         "wall_s": vllm_span_s, "output_tokens_per_s": output_tokens / vllm_span_s,
         "num_steps": len(vllm_run.steps), "median_decode_step_s": float(np.median(vllm_decode_s)),
         "torch_threads": vllm_threads},
        {"engine": "kvbench_real", "num_requests": len(requests), "output_tokens": output_tokens,
         "wall_s": kvbench_span_s, "output_tokens_per_s": output_tokens / kvbench_span_s,
         "num_steps": len(durations), "median_decode_step_s": float(np.median(kvbench_decode_s)),
         "torch_threads": kvbench_threads},
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["ratio_to_vllm"] = frame["output_tokens_per_s"] / frame["output_tokens_per_s"].iloc[0]
    return frame, _profile_text(profiler)


def _profile_text(profiler: cProfile.Profile) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.strip_dirs().sort_stats("tottime").print_stats(NUM_PROFILED_FUNCTIONS)
    lines = stream.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:]) + "\n"


def fair_summary(fair: pd.DataFrame) -> list[str]:
    """One line per engine of the fair-instrument batch."""
    return [
        f"- {row.engine}: {row.output_tokens_per_s:.1f} output tokens/s ({row.output_tokens} "
        f"tokens in {row.wall_s:.2f} s, {row.num_steps} steps, median decode step "
        f"{row.median_decode_step_s * 1e3:.1f} ms, {row.torch_threads} torch threads), "
        f"{row.ratio_to_vllm:.2f}x vLLM's"
        for row in fair.itertuples(index=False)
    ]
