"""The fair-instrument check of ``experiment=sim_to_vllm``: one closed batch, two engines.

The same requests (``sim_to_vllm.fair_*``: all at t = 0, distinct prompts) are served by real vLLM
and by kvbench's real executor (``executor=real``'s ``paged``), one after the other, unprofiled:
their output tokens/s are the measurement (``fair_instrument.parquet``); kvbench's serves them
again with the other matmul library (``executor.linear_backend``), for scale. Then each engine
serves the batch again, cut to ``PROFILED_OUTPUT_TOKENS`` output tokens a request, under two
profilers at once, to say where the time goes: cProfile (Python
functions by own time: the model code of both, since vLLM runs in this process with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and torch.profiler (torch and custom C++ ops by self CPU
time, which cProfile folds into the Python call that launched them). Both engines' top entries go
to ``fair_profile.parquet`` and side by side into the run's ``report.md``, per step in ms.
"""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.config import KvbenchConfig
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler
from kvbench.referee.vllm_engine import VllmEngine, replay
from kvbench.tasks.simulate.experiment import scheduler_limits
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads

# Entries of each profile kept per engine (by own time).
NUM_PROFILED_ENTRIES = 15
# Output tokens of each request in the profiled passes: the profilers keep a record of every op
# and call (the whole 64-token batch grew this process past 14 GB on this machine), and per-step
# costs need only a few steps of each kind (the prompts' steps, then about as many decodes).
PROFILED_OUTPUT_TOKENS = 16
ENGINES = ("vllm", "kvbench_real")
# vLLM's CPU backend runs its linear layers through oneDNN on prepacked weights (``_C::onednn_mm``
# in its profile), what kvbench's executor.linear_backend=onednn calls.
VLLM_CPU_LINEAR_BACKEND = "onednn"


@dataclasses.dataclass(frozen=True)
class FairInstrument:
    """The check's results: one row per engine (``fair_instrument.parquet``), and both engines'
    profiles, top entries by own time (``fair_profile.parquet``)."""

    throughput: pd.DataFrame
    profile: pd.DataFrame


def fair_requests(cfg: KvbenchConfig) -> list[Request]:
    """The fair-instrument batch: ``sim_to_vllm.fair_num_requests`` requests, all at t = 0, of
    ``fair_prompt_tokens`` + ``fair_output_tokens`` (distinct prompts: no prefix to share)."""
    fair = cfg.sim_to_vllm
    return [Request(request_id, 0.0, fair.fair_prompt_tokens, fair.fair_output_tokens)
            for request_id in range(fair.fair_num_requests)]  # fmt: skip


def fair_instrument(cfg: KvbenchConfig, deployment: Deployment,
                    engine: VllmEngine) -> FairInstrument:  # fmt: skip
    """The same closed batch served by vLLM and by kvbench's real executor (``paged`` over
    ``scheduler=vllm_v0``'s batches, the same ``max_num_seqs``): output tokens/s, steps and the
    median decode step of each, measured one after the other (kvbench's on its configured matmul
    library, then on the other); then each served again (shorter) under cProfile and
    torch.profiler, kvbench's on its configured library."""
    import torch

    from kvbench.executors.real import run_real

    requests = fair_requests(cfg)
    output_tokens = sum(request.output_tokens for request in requests)
    vllm_threads = torch.get_num_threads()  # as vLLM's CPU worker left them
    vllm_run = replay(engine, requests)
    limits = dataclasses.replace(scheduler_limits(cfg, deployment), preemption="recompute")

    def kvbench_executor(run_cfg: KvbenchConfig = cfg) -> tuple[Any, Any]:
        model = load_real_model(run_cfg)  # loaded once per matmul library (cached)
        return _kvbench_executor(run_cfg, deployment, model)

    def serve_on_kvbench(batch: list[Request], allocator_and_executor: tuple[Any, Any]) -> Any:
        return run_real(batch, Scheduler(limits), *allocator_and_executor)

    rows = [_throughput_row("vllm", output_tokens, max(t.finish_s for t in vllm_run.requests),
                            [step.duration_s for step in vllm_run.steps],
                            [step.num_prefill_tokens for step in vllm_run.steps], vllm_threads,
                            VLLM_CPU_LINEAR_BACKEND)]  # fmt: skip
    pin_threads(cfg.executor.num_threads)  # vLLM's worker may have set its own
    kvbench_threads = torch.get_num_threads()
    # The configured matmul library first, then each other one this machine runs, for scale.
    for run_cfg in (cfg, *_other_matmul_libraries(cfg)):
        served = serve_on_kvbench(requests, kvbench_executor(run_cfg))
        steps = served.result.steps.columns
        rows.append(_throughput_row("kvbench_real", output_tokens,
                                    max(record.finish_s for record in served.result.requests),
                                    list(steps["duration_s"]), list(steps["num_prefill_tokens"]),
                                    kvbench_threads, run_cfg.executor.linear_backend))  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.insert(1, "num_requests", len(requests))
    frame["ratio_to_vllm"] = frame["output_tokens_per_s"] / frame["output_tokens_per_s"].iloc[0]
    short = [dataclasses.replace(request,
                                 output_tokens=min(request.output_tokens, PROFILED_OUTPUT_TOKENS))
             for request in requests]  # fmt: skip
    torch.set_num_threads(vllm_threads)
    vllm_profile = _profiled("vllm", lambda: len(replay(engine, short).steps))
    pin_threads(cfg.executor.num_threads)
    # Set up and warmed up before the profilers start, as vLLM's engine is: only the serving
    # is divided by its steps.
    warmed = kvbench_executor()
    kvbench_profile = _profiled(
        "kvbench_real",
        lambda: len(serve_on_kvbench(short, warmed).result.steps.columns["duration_s"]),
    )
    return FairInstrument(frame, pd.concat([vllm_profile, kvbench_profile], ignore_index=True))


def _other_matmul_libraries(cfg: KvbenchConfig) -> list[KvbenchConfig]:
    """``cfg`` with each other ``executor.linear_backend`` this machine runs."""
    from kvbench.executors.names import LINEAR_BACKENDS, onednn_problem, resolve_device

    device = resolve_device(cfg.executor.device)
    return [dataclasses.replace(cfg, executor=dataclasses.replace(cfg.executor,
                                                                  linear_backend=backend))
            for backend in LINEAR_BACKENDS
            if backend != cfg.executor.linear_backend
            and onednn_problem(backend, device, cfg.model.dtype) is None]  # fmt: skip


def _kvbench_executor(cfg: KvbenchConfig, deployment: Deployment, model: Any) -> tuple[Any, Any]:
    """A fresh ``paged`` allocator over the run's pool and the real executor on it, warmed up."""
    from kvbench.executors.real import RealExecutor

    block_size = cfg.allocator.block_size
    num_slots = pool_slots(deployment, block_size, cfg.allocator.num_gpu_blocks)
    allocator = make_allocator("paged", num_slots, block_size, deployment.model.max_model_len)
    executor = RealExecutor(model, allocator, cfg.executor.decode_backend, cfg.model.kv_dtype)
    executor.warm_up()
    return allocator, executor


def _throughput_row(engine: str, output_tokens: int, wall_s: float,
                    step_durations_s: list[float], step_prefill_tokens: list[int],
                    torch_threads: int, linear_backend: str) -> dict[str, Any]:  # fmt: skip
    decode_s = [d for d, p in zip(step_durations_s, step_prefill_tokens, strict=True) if p == 0]
    return {"engine": engine, "output_tokens": output_tokens,
            "wall_s": wall_s, "output_tokens_per_s": output_tokens / wall_s,
            "num_steps": len(step_durations_s), "median_decode_step_s": float(np.median(decode_s)),
            "torch_threads": torch_threads, "linear_backend": linear_backend}  # fmt: skip


def _profiled(engine: str, serve: Callable[[], int]) -> pd.DataFrame:
    """Run ``serve`` (it returns the steps it ran) under cProfile and torch.profiler at once; the
    top entries of each by own time, per step."""
    import torch

    python = cProfile.Profile()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ops:
        python.enable()
        num_steps = serve()
        python.disable()
    rows = _op_rows(ops.key_averages()) + _function_rows(python)
    frame = pd.DataFrame(rows, columns=["profiler", "name", "num_calls", "self_s"])
    frame = (frame.sort_values("self_s", ascending=False).groupby("profiler", sort=False)
             .head(NUM_PROFILED_ENTRIES).reset_index(drop=True))  # fmt: skip
    frame.insert(0, "engine", engine)
    frame["num_steps"] = num_steps
    frame["self_ms_per_step"] = frame["self_s"] * 1e3 / num_steps
    frame["calls_per_step"] = frame["num_calls"] / num_steps
    return frame


def _op_rows(averages: Any) -> list[tuple[str, str, int, float]]:
    """torch.profiler's ops: (``torch_op``, name, calls, self CPU seconds)."""
    return [("torch_op", event.key, int(event.count), event.self_cpu_time_total / 1e6)
            for event in averages]  # fmt: skip


def _function_rows(profiler: cProfile.Profile) -> list[tuple[str, str, int, float]]:
    """cProfile's functions: (``python``, file:line(function), calls, own seconds)."""
    stats = pstats.Stats(profiler).strip_dirs()
    entries = stats.stats.items()  # type: ignore[attr-defined]  # typeshed lacks it
    # A key is (file, line, function), as pstats prints it: file:line(function).
    return [("python", f"{file}:{line}({function})", int(entry[1]), float(entry[2]))
            for (file, line, function), entry in entries]  # fmt: skip


def fair_summary(fair: pd.DataFrame) -> list[str]:
    """One line per engine of the fair-instrument batch."""
    return [
        f"- {row.engine}: {row.output_tokens_per_s:.1f} output tokens/s ({row.output_tokens} "
        f"tokens in {row.wall_s:.2f} s, {row.num_steps} steps, median decode step "
        f"{row.median_decode_step_s * 1e3:.1f} ms, {row.torch_threads} torch threads, matmuls "
        f"through {row.linear_backend}), {row.ratio_to_vllm:.2f}x vLLM's"
        for row in fair.itertuples(index=False)
    ]


def profile_tables(profile: pd.DataFrame) -> str:
    """Both engines' top entries side by side, per profiler, as markdown tables (ms per step)."""
    sections = []
    titles = {"torch_op": "torch ops by self CPU time (torch.profiler)",
              "python": "Python functions by own time (cProfile)"}  # fmt: skip
    for profiler, title in titles.items():
        columns = [profile[(profile["engine"] == engine) & (profile["profiler"] == profiler)]
                   .reset_index(drop=True) for engine in ENGINES]  # fmt: skip
        steps = [int(column["num_steps"].iloc[0]) if len(column) else 0 for column in columns]
        lines = [f"{title}, per step ({steps[0]} vLLM steps, {steps[1]} kvbench steps):", "",
                 "| # | vLLM | ms/step | calls/step | kvbench real | ms/step | calls/step |",
                 "|---|---|---|---|---|---|---|"]  # fmt: skip
        for rank in range(max(len(column) for column in columns)):
            cells = []
            for column in columns:
                if rank < len(column):
                    entry = column.iloc[rank]
                    name = str(entry["name"]).replace("|", "\\|")
                    cells += [f"`{name}`", f"{entry['self_ms_per_step']:.2f}",
                              f"{entry['calls_per_step']:.1f}"]  # fmt: skip
                else:
                    cells += ["", "", ""]
            lines.append(f"| {rank + 1} | " + " | ".join(cells) + " |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"
