"""``python -m kvbench.tools.bench``: how fast the engine simulates, and how much memory it needs.

Not a test: it prints figures measured in one run on this machine (docs/performance.md).

Cases (each in a fresh process, so its peak memory is its own):

- ``azure``: the full Azure LLM inference conversation trace (2023) with its own arrival times,
  Llama-2-70B on 4x A100-80GB (tensor parallel 4), ``paged``, 16-token blocks; the fast path and
  the step-by-step reference, with their speed ratio and whether every record is identical.
- ``sharegpt_1m``: 1,000,000 requests resampled from the shipped ShareGPT profile (vLLM's filter),
  Poisson arrivals, same deployment; the fast path with steps and requests streamed to parquet.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import resource
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

AZURE_TRACE = Path("../shared/traces/azure2023/AzureLLMInferenceTrace_conv.csv")
DEPLOYMENT = ("model=llama-2-70b", "hardware=a100-80gb", "hardware.num_gpus=4",
              "allocator.block_size=16")
MIB = 1024 * 1024


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
        "token_states_pct_of_used": summary["token_states_pct_of_used"],
        "steps_parquet_rows": steps_out.num_rows,
    }


def _child(target: str, args: tuple, queue: Any) -> None:
    queue.put(globals()[target](*args))


def _in_fresh_process(target: str, *args: Any) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(target, args, queue))
    process.start()
    figures = queue.get()
    process.join()
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print one line of figures per case (also written as JSON)."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("azure", "sharegpt_1m", "all"), default="all")
    parser.add_argument("--azure-trace", type=Path, default=AZURE_TRACE)
    parser.add_argument("--num-requests", type=int, default=1_000_000)
    parser.add_argument("--request-rate", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    cases = ("azure", "sharegpt_1m") if args.case == "all" else (args.case,)
    if "azure" in cases and not args.azure_trace.is_file():
        print(f"kvbench.tools.bench: {args.azure_trace} not found; pass --azure-trace PATH to "
              f"AzureLLMInferenceTrace_conv.csv (../shared/traces/azure2023)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    all_figures = []
    for case in cases:
        if case == "azure":
            figures = _in_fresh_process("run_azure", str(args.azure_trace.resolve()))
        else:
            figures = _in_fresh_process("run_sharegpt", args.num_requests, args.request_rate,
                                        args.out / "sharegpt_1m")
        print(json.dumps(figures))
        all_figures.append(figures)
    (args.out / "bench.json").write_text(json.dumps(all_figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
