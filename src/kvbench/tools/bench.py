"""``python -m kvbench.tools.bench``: how fast the engine simulates, and how much memory it needs.

Not a test: it prints figures measured in one run on this machine (docs/performance.md).

Cases (each in a fresh process, so its peak memory is its own):

- ``azure``: the full Azure LLM inference conversation trace (2023) with its own arrival times,
  Llama-2-70B on 4x A100-80GB (tensor parallel 4), ``paged``, 16-token blocks; the fast path and
  the step-by-step reference, with their speed ratio and whether every record is identical.
- ``sharegpt_1m``: 1,000,000 requests resampled from the shipped ShareGPT profile (vLLM's filter),
  Poisson arrivals, same deployment; the fast path with steps and requests streamed to parquet.
- ``command``: the whole command a user types, ``python -m kvbench`` (``COMMAND_OVERRIDES``: the
  Azure trace's arrivals rescaled to four rates, Llama-2-70B on 4x A100-80GB, ``paged``) as a
  subprocess timed end to end, against the engine's summed time (``simulation_wall_s`` in its
  ``summary.parquet``) plus the interpreter's start (``python -c pass``): the overhead of
  everything around the engine (imports, config, trace reading, tables, parquet, charts).
- ``azure_v1`` (not in ``all``): the same trace and deployment under ``scheduler=vllm_v1``, every
  allocator of the main experiment (``V1_ALLOCATORS``): its fast path (lazy decoders and decode
  stretches) and its step-by-step reference, their times, speed ratio and whether every record
  is identical.
- ``v1_referee`` (not in ``all``: it needs the referee, docs/referee.md): ``scheduler=vllm_v1``'s
  step model (``engine.scheduler_v1``, fast path, prefix caching on) against vLLM's own scheduler
  loop (``referee.run_referee``, no model) on the same ``V1_WORKLOAD`` (``--v1-requests``
  requests), one run each: their times, the ratio, and whether every step is identical.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import queue as queue_module
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

AZURE_TRACE = Path("../shared/traces/azure2023/AzureLLMInferenceTrace_conv.csv")
DEPLOYMENT = ("model=llama-2-70b", "hardware=a100-80gb", "hardware.num_gpus=4",
              "allocator.block_size=16")
MIB = 1024 * 1024
# The whole command: experiment=sharegpt_70b (Llama-2-70B, 4x A100-80GB, rates 2, 5, 10, 20 req/s)
# on the Azure trace, whose timestamps ``workload=trace`` rescales to each rate; ``paged`` alone,
# under the paper's engine only (``~schedulers``: the experiment also runs vllm_v1).
COMMAND_OVERRIDES = ("experiment=sharegpt_70b", "workload=trace", "allocators=[paged]",
                     "hardware.num_gpus=4", "request_rates=[2,5,10,20]", "~schedulers")
# The bound on whole-process time / (engine's summed time + interpreter start).
COMMAND_TARGET_RATIO = 1.6


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB  # Linux: KiB


def _compose(overrides: tuple[str, ...]) -> tuple[Any, Any, Any]:
    from hydra import compose, initialize_config_module

    from kvbench.config import validate_config

    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        raw = compose(config_name="config", overrides=list(overrides))
    typed, deployment = validate_config(raw)
    return typed, deployment, raw


def _simulate(cfg: Any, deployment: Any, requests: list, fast: bool, **sinks: Any) -> Any:
    """(result, engine seconds): the run's time without building its parts (or imports)."""
    from kvbench.allocators import make_allocator
    from kvbench.engine import Scheduler, simulate
    from kvbench.tasks.simulate.experiment import cost_model, scheduler_limits

    allocator = make_allocator("paged", deployment.num_kv_slots, cfg.allocator.block_size,
                               deployment.model.max_model_len)
    scheduler = Scheduler(scheduler_limits(cfg, deployment))
    costs = cost_model(cfg, deployment)
    started_s = time.perf_counter()
    result = simulate(requests, scheduler, allocator, costs, fast=fast, **sinks)
    return result, time.perf_counter() - started_s


# The azure_v1 case's allocators: the main experiment's.
V1_ALLOCATORS = ("naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix")


def _simulate_v1(cfg: Any, deployment: Any, requests: list, name: str, fast: bool) -> Any:
    """(result, engine seconds) of allocator ``name`` under ``scheduler=vllm_v1``."""
    from kvbench.engine.simulate_v1 import simulate_v1
    from kvbench.tasks.simulate.experiment import (
        allocator_for,
        cost_model,
        scheduler_limits,
        v1_limits,
        v1_memory,
    )

    allocator = allocator_for(cfg, deployment, name, deployment.num_kv_slots, None)
    limits = v1_limits(scheduler_limits(cfg, deployment))
    memory = v1_memory(name, allocator, limits)
    costs = cost_model(cfg, deployment, name)
    started_s = time.perf_counter()
    result = simulate_v1(requests, memory, limits, costs, allocator.num_slots, fast=fast)
    return result, time.perf_counter() - started_s


# The v1 comparison's workload: prompts 10-1,000 and outputs 1-400 tokens (seeded), a third of
# them opening with one of 8 shared system prompts of 100-548 tokens, all arriving at once, on an
# engine of 8,000 blocks of 16 (null block included), a 2,048-token budget, 256 sequences, a
# 2,048-token context: it preempts and evicts.
V1_WORKLOAD = {"seed": 0, "num_gpu_blocks": 8000, "block_size": 16, "max_num_seqs": 256,
               "max_num_batched_tokens": 2048, "max_model_len": 2048}


def v1_requests(num_requests: int, seed: int) -> list:
    """The v1 comparison's requests (``V1_WORKLOAD``)."""
    import random

    from kvbench.core.request import Request

    rng = random.Random(seed)
    requests = []
    for request_id in range(num_requests):
        group = rng.randrange(8) if rng.random() < 1 / 3 else None
        prefix_tokens = 0 if group is None else 100 + 64 * group
        requests.append(Request(request_id, 0.0, rng.randint(10, 1000), rng.randint(1, 400),
                                prefix_group=group, prefix_tokens=prefix_tokens))  # fmt: skip
    return requests


def run_v1_referee(num_requests: int) -> dict[str, Any]:
    """kvbench's vllm_v1 step model against vLLM's scheduler loop, one run each."""
    from kvbench.allocators.paged import PagedAllocator
    from kvbench.engine.scheduler_v1 import V1Limits, run_v1_steps
    from kvbench.referee.vllm_v1 import RefereeLimits, run_referee
    from kvbench.tasks.simulate.experiment import v1_memory

    w = V1_WORKLOAD
    requests = v1_requests(num_requests, w["seed"])
    referee_limits = RefereeLimits(w["block_size"], w["num_gpu_blocks"], w["max_num_seqs"],
                                   w["max_num_batched_tokens"], w["max_model_len"], True)
    run_referee(requests[:2], referee_limits)  # vLLM's first start (model inspection) untimed
    started_s = time.perf_counter()
    theirs = run_referee(requests, referee_limits)
    referee_s = time.perf_counter() - started_s
    allocator = PagedAllocator((w["num_gpu_blocks"] - 1) * w["block_size"], w["block_size"],
                               w["max_model_len"], enable_prefix_caching=True)
    limits = V1Limits(w["max_num_seqs"], w["max_num_batched_tokens"], w["max_model_len"])
    started_s = time.perf_counter()
    ours = run_v1_steps(requests, v1_memory("paged_prefix", allocator, limits), limits)
    kvbench_s = time.perf_counter() - started_s
    fields = ("step_index", "scheduled_tokens", "num_blocks_in_use", "preempted_request_ids",
              "finished_request_ids", "num_running", "num_waiting", "prefix_query_tokens",
              "prefix_hit_tokens", "resumed_query_tokens", "resumed_hit_tokens")
    identical = sum(
        all(getattr(a, f) == getattr(b, f) for f in fields)
        for a, b in zip(ours, theirs, strict=False)
    )
    return {
        "case": "v1_referee",
        "num_requests": num_requests,
        "num_steps": len(ours),
        "referee_steps": len(theirs),
        "identical_steps": identical,
        "num_preemptions": sum(len(step.preempted_request_ids) for step in ours),
        "prefix_hit_tokens": sum(step.prefix_hit_tokens for step in ours),
        "referee_s": referee_s,
        "kvbench_s": kvbench_s,
        "speedup": referee_s / kvbench_s,
    }


def _same(left: dict, right: dict) -> bool:
    """Equal summaries, NaN equal to NaN (the last digit counts)."""
    def canon(value: Any) -> Any:
        return "nan" if isinstance(value, float) and math.isnan(value) else value
    return {k: canon(v) for k, v in left.items()} == {k: canon(v) for k, v in right.items()}


def run_azure(trace: str) -> dict[str, Any]:
    """The Azure conversation trace, fast path and reference."""
    from kvbench.tasks.simulate.table import requests_frame, summarize
    from kvbench.workloads import build_workload, to_requests

    cfg, deployment, _ = _compose((*DEPLOYMENT, "workload=trace", f"workload.path={trace}",
                                   "workload.arrival=trace", "workload.filter=none",
                                   "workload.name=azure_conv"))
    requests = to_requests(build_workload(cfg.workload, deployment.model.max_model_len))
    results = {}
    for fast in (True, False):
        result, engine_s = _simulate(cfg, deployment, requests, fast)
        summary = summarize(requests_frame(result), result, deployment)
        results[fast] = (result, engine_s, summary)
    (fast_result, fast_s, fast_summary), (ref_result, ref_s, ref_summary) = (
        results[True], results[False]
    )
    return {
        "case": "azure",
        "num_requests": len(requests),
        "num_steps": len(fast_result.steps),
        "fast_engine_s": fast_s,
        "reference_engine_s": ref_s,
        "speedup": ref_s / fast_s,
        "fast_requests_per_s": len(requests) / fast_s,
        "identical_summary": _same(fast_summary, ref_summary),
        "identical_steps": fast_result.steps.columns == ref_result.steps.columns,
        "identical_requests": fast_result.requests == ref_result.requests,
        "mean_batch_size": fast_summary["mean_batch_size"],
        "peak_rss_mib": _peak_rss_mib(),
    }


def run_azure_v1(trace: str) -> dict[str, Any]:
    """The Azure conversation trace under vllm_v1, every allocator: fast path and reference."""
    from kvbench.workloads import build_workload, to_requests

    cfg, deployment, _ = _compose((*DEPLOYMENT, "scheduler=vllm_v1", "workload=trace",
                                   f"workload.path={trace}", "workload.arrival=trace",
                                   "workload.filter=none", "workload.name=azure_conv"))  # fmt: skip
    requests = to_requests(build_workload(cfg.workload, deployment.model.max_model_len))
    runs = []
    for name in V1_ALLOCATORS:
        fast_result, fast_s = _simulate_v1(cfg, deployment, requests, name, fast=True)
        reference, reference_s = _simulate_v1(cfg, deployment, requests, name, fast=False)
        runs.append({
            "allocator": name,
            "num_steps": len(fast_result.steps),
            "fast_engine_s": fast_s,
            "reference_engine_s": reference_s,
            "speedup": reference_s / fast_s,
            "identical_steps": fast_result.steps.columns == reference.steps.columns,
            "identical_requests": fast_result.requests == reference.requests,
        })  # fmt: skip
    return {"case": "azure_v1", "num_requests": len(requests), "runs": runs,
            "peak_rss_mib": _peak_rss_mib()}  # fmt: skip


def run_sharegpt(num_requests: int, request_rate: float, out_dir: Path) -> dict[str, Any]:
    """``num_requests`` resampled ShareGPT requests, streamed to parquet."""
    from kvbench.tables.parquet_stream import ParquetStream
    from kvbench.tables.provenance import provenance
    from kvbench.tasks.simulate.table import add_request_latencies, summarize
    from kvbench.workloads import build_workload, to_requests

    cfg, deployment, raw = _compose((*DEPLOYMENT, "workload=sharegpt",
                                     f"workload.num_requests={num_requests}",
                                     f"workload.request_rate={request_rate}"))
    started_s = time.perf_counter()
    workload = build_workload(cfg.workload, deployment.model.max_model_len)
    requests = to_requests(workload)
    del workload
    gc.collect()
    build_s = time.perf_counter() - started_s
    rss_before_mib = _peak_rss_mib()
    metadata = provenance(raw)
    steps_out = ParquetStream(out_dir / "steps.parquet", metadata)
    requests_out = ParquetStream(out_dir / "requests.parquet", metadata)
    result, engine_s = _simulate(cfg, deployment, requests, True,
                                 step_sink=steps_out.write_columns,
                                 record_sink=requests_out.write_records)
    peak_rss_mib = _peak_rss_mib()
    steps_out.close()
    requests_out.close()
    summary = summarize(add_request_latencies(pd.read_parquet(requests_out.path)), result,
                        deployment)
    return {
        "case": "sharegpt_1m",
        "num_requests": len(requests),
        "request_rate": request_rate,
        "num_steps": len(result.steps),
        "build_s": build_s,
        "fast_engine_s": engine_s,
        "fast_requests_per_s": len(requests) / engine_s,
        "rss_before_engine_mib": rss_before_mib,
        "peak_rss_mib": peak_rss_mib,
        "mean_batch_size": summary["mean_batch_size"],
        "num_finished": summary["num_finished"],
        "token_states_pct_of_held": summary["token_states_pct_of_held"],
        "steps_parquet_rows": steps_out.num_rows,
    }


def _process_s(args: list[str]) -> float:
    """Wall time of ``python ARGS`` run to completion (it must succeed)."""
    started_s = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    wall_s = time.perf_counter() - started_s
    if done.returncode != 0:
        raise CaseFailed(f"python {' '.join(args)} exited {done.returncode}: "
                         f"{' '.join(done.stderr.split())[-2000:]}")
    return wall_s


def command_args(trace: str, run_dir: Path) -> list[str]:
    """The ``python -m kvbench`` arguments of the ``command`` case, writing into ``run_dir``."""
    return ["-m", "kvbench", *COMMAND_OVERRIDES, f"workload.path={trace}",
            f"hydra.run.dir={run_dir}", "skip_done=false"]


def _command_run(trace: str, run_dir: Path) -> dict[str, float]:
    """One whole command and its interpreter baselines, timed back to back."""
    shutil.rmtree(run_dir, ignore_errors=True)
    start_s = _process_s(["-c", "pass"])
    import_cli_s = _process_s(["-c", "import kvbench.cli"])
    whole_s = _process_s(command_args(trace, run_dir))
    summary = pd.read_parquet(run_dir / "summary.parquet")
    engine_s = float(summary["simulation_wall_s"].sum())
    return {
        "whole_s": whole_s,
        "engine_s": engine_s,
        "start_s": start_s,
        "import_cli_s": import_cli_s,
        "ratio": whole_s / (engine_s + start_s),
        "num_runs": len(summary),
        "num_requests": int(summary["num_requests"].iloc[0]),
        "num_steps": int(summary["num_steps"].sum()),
    }


def run_command(trace: str, out_dir: Path, repeats: int) -> dict[str, Any]:
    """The whole command ``repeats`` times; the figures of the run with the median ratio, and
    every run's ratio."""
    runs = [_command_run(trace, out_dir / "command") for _ in range(repeats)]
    median = statistics.median_low(run["ratio"] for run in runs)
    figures = next(run for run in runs if run["ratio"] == median)
    return {
        "case": "command",
        "command": "python " + " ".join(command_args(trace, out_dir / "command")),
        **figures,
        "target_ratio": COMMAND_TARGET_RATIO,
        "ratios": [round(run["ratio"], 3) for run in runs],
        "whole_s_all": [round(run["whole_s"], 3) for run in runs],
    }


class CaseFailed(RuntimeError):
    """A case that measured nothing: its error, in one line."""


def _child(target: str, args: tuple, queue: Any) -> None:
    try:
        queue.put(("figures", globals()[target](*args)))
    except Exception as error:  # the parent says it in one line, and keeps the other cases'
        queue.put(("error", " ".join(f"{type(error).__name__}: {error}".split())))


def _in_fresh_process(target: str, *args: Any) -> dict[str, Any]:
    """``target(*args)``'s figures, computed in a fresh process (a clean heap to measure);
    CaseFailed when it raises or dies (killed for memory, say) instead of waiting forever."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(target, args, queue))
    process.start()
    while True:
        try:
            kind, value = queue.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not process.is_alive() and queue.empty():
                raise CaseFailed(f"its process ended (exit code {process.exitcode}) without "
                                 "figures") from None
    process.join()
    if kind == "error":
        raise CaseFailed(value)
    return value


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print one line of figures per case (also written as JSON)."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("azure", "sharegpt_1m", "command", "azure_v1",
                                           "v1_referee", "all"), default="all")
    parser.add_argument("--v1-requests", type=int, default=5000,
                        help="requests of the v1_referee case")
    parser.add_argument("--azure-trace", type=Path, default=AZURE_TRACE)
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--request-rate", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    parser.add_argument("--repeats", type=int, default=3,
                        help="whole commands timed by the command case (its median is printed)")
    args = parser.parse_args(argv)
    cases = ("azure", "sharegpt_1m", "command") if args.case == "all" else (args.case,)
    if args.repeats < 1:
        print(f"kvbench.tools.bench: --repeats {args.repeats} is invalid; expected an integer "
              f">= 1", file=sys.stderr)
        return 2
    if {"azure", "azure_v1", "command"} & set(cases) and not args.azure_trace.is_file():
        print(f"kvbench.tools.bench: {args.azure_trace} not found; pass --azure-trace PATH to "
              f"AzureLLMInferenceTrace_conv.csv (../shared/traces/azure2023)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    all_figures: list[dict[str, Any]] = []
    for case in cases:
        try:
            figures = _run_case(case, args)
        except CaseFailed as error:
            kept = (f"; the figures of {', '.join(cases[: len(all_figures)])} are in "
                    f"{args.out / 'bench.json'}" if all_figures else "")  # fmt: skip
            print(f"kvbench.tools.bench: case {case} failed: {error}{kept}", file=sys.stderr)
            return 3
        print(json.dumps(figures))
        all_figures.append(figures)
        # After each case: a later case that fails keeps the earlier ones' figures.
        (args.out / "bench.json").write_text(json.dumps(all_figures, indent=2) + "\n")
    return 0


def _run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    if case == "azure":
        return _in_fresh_process("run_azure", str(args.azure_trace.resolve()))
    if case == "azure_v1":
        return _in_fresh_process("run_azure_v1", str(args.azure_trace.resolve()))
    if case == "v1_referee":
        return _in_fresh_process("run_v1_referee", args.v1_requests)
    if case == "command":
        return run_command(str(args.azure_trace.resolve()), args.out.resolve(), args.repeats)
    return _in_fresh_process("run_sharegpt", args.num_requests, args.request_rate,
                             args.out / "sharegpt_1m")


if __name__ == "__main__":
    sys.exit(main())
