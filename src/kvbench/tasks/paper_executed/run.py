"""``python -m kvbench experiment=paper_executed``: the vLLM paper's comparison served for real.

The same requests are served on the real model (``executors.real``) by every allocator, in
interleaved rounds (each round rotates the order, so the machine's noise hits every allocator
alike), and simulated with the profile of ``executor.profile`` and with the roofline. Before and
after each real run two decode steps of fixed shapes (``PROBES``) are timed and priced with the
profile: how fast the machine then is against the profile, which tells a simulation's error from
a machine whose speed drifted since the profile was fitted. Writes
``paper_executed_runs.parquet`` (one row per run), ``paper_executed.parquet`` (medians per source
and allocator, paged's ratios over the baselines), ``paper_executed.md`` (that table),
``plots/paper_executed.png`` and ``report.md`` (docs/paper_executed.md).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.allocators import make_allocator
from kvbench.config import KvbenchConfig, run_rates, run_workloads
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.request import Request
from kvbench.core.specs import Deployment
from kvbench.engine import Scheduler, simulate
from kvbench.engine.cost_model import CostModel
from kvbench.engine.scheduler import SchedulerLimits
from kvbench.tables.atomic import write_text_atomic
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.paper_executed.table import (
    MEASURED,
    PROBE_COLUMNS,
    markdown_rows,
    paper_table,
    run_figures,
)
from kvbench.tasks.profile.grid import IterationPoint, spread_contexts
from kvbench.tasks.profile.profile_file import (
    checked_profile,
    load_profiled_cost_model,
)
from kvbench.tasks.simulate.experiment import cost_model, scheduler_limits
from kvbench.tasks.simulate.real_runner import load_real_model, pin_threads
from kvbench.tasks.simulate.run_outputs import print_files, write_task_report
from kvbench.workloads import to_requests, with_arrivals, workload_rows

# Prices one allocator's iterations in a simulation: (allocator name, its kernel block size).
CostModelFor = Callable[[str, int], CostModel]


@dataclasses.dataclass(frozen=True)
class ServingSetup:
    """What every run of the comparison shares: the scheduler's limits, the pool, the decode
    kernel's backend, and the profile the machine probes are priced with (None: no probes)."""

    limits: SchedulerLimits
    num_slots: int
    block_size: int
    max_model_len: int
    deployment: Deployment
    decode_backend: str
    probe_cost_model: CostModel | None = None


# Decode steps timed before and after every real run and priced with the profile (grid points of
# task=profile, so 1 within its fit error when the machine runs as fast as when it was fitted):
# a small batch and a large one, because a drift need not slow them alike (once 1.06 against
# 1.23: docs/paper_executed.md).
PROBE_BLOCK_SIZE = 16
PROBES = dict(zip(PROBE_COLUMNS, (
    IterationPoint(PROBE_BLOCK_SIZE, decode_contexts=spread_contexts(4, 256)),
    IterationPoint(PROBE_BLOCK_SIZE, decode_contexts=spread_contexts(16, 64)),
), strict=True))  # fmt: skip
PROBE_REPEATS = 5


def run_paper_executed(
    cfg: KvbenchConfig, deployment: Deployment, raw_cfg: Any, output_dir: Path
) -> pd.DataFrame:
    """Serve the workload for real under every allocator, simulate it twice, write the
    comparison; returns ``paper_executed.parquet``'s table."""
    started_s = time.perf_counter()
    pin_threads(cfg.executor.num_threads)
    # Checked before the model loads: a profile of another model or K/V dtype stops the run.
    _warn_of_another_setup(str(cfg.executor.profile), deployment, cfg.executor.decode_backend,
                           cfg.executor.linear_backend)
    model = load_real_model(cfg)
    setup = ServingSetup(
        limits=scheduler_limits(cfg, deployment),
        num_slots=pool_slots(deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks),
        block_size=cfg.allocator.block_size,
        max_model_len=deployment.model.max_model_len,
        deployment=deployment,
        decode_backend=cfg.executor.decode_backend,
        probe_cost_model=load_profiled_cost_model(str(cfg.executor.profile),
                                                  PROBE_BLOCK_SIZE, deployment),
    )
    simulated: dict[str, CostModelFor] = {
        "profiled": lambda name, block_size: load_profiled_cost_model(
            str(cfg.executor.profile), block_size, deployment),
        "roofline": lambda name, block_size: cost_model(cfg, deployment, name),
    }  # fmt: skip
    label, workload_cfg = next(iter(run_workloads(cfg).items()))
    rows = workload_rows(workload_cfg, setup.max_model_len)
    runs = []
    for rate in run_rates(cfg, label, workload_cfg):
        requests = to_requests(with_arrivals(rows, dataclasses.replace(workload_cfg,
                                                                       request_rate=rate)))
        served = serve_rounds(model, requests, cfg.allocators, cfg.paper_executed.rounds, setup)
        priced = simulate_sources(requests, cfg.allocators, simulated, setup)
        runs.append(pd.concat([served, priced], ignore_index=True).assign(request_rate=rate))
    runs_table = pd.concat(runs, ignore_index=True).assign(workload=label)
    table = paper_table(runs_table).assign(workload=label)
    metadata = provenance(raw_cfg)
    write_table(runs_table, output_dir / "paper_executed_runs.parquet", metadata)
    write_table(table, output_dir / "paper_executed.parquet", metadata)
    markdown = markdown_rows(table)
    write_text_atomic(output_dir / "paper_executed.md", markdown + "\n")
    if cfg.plots:
        from kvbench.plots.paper_executed_chart import paper_executed_chart

        paper_executed_chart(table, output_dir / "plots")
    load = runs_table.loc[runs_table["source"] == MEASURED, "load_average_1m"]
    elapsed_s = time.perf_counter() - started_s
    print(f"paper_executed: {cfg.model.name} on {deployment.hardware.name}, {label}, "
          f"{len(runs_table)} runs in {elapsed_s:.0f} s (1-min load average at the real runs' "
          f"starts {load.min():.1f}-{load.max():.1f})\n{markdown}")  # fmt: skip
    write_task_report(output_dir, f"{cfg.experiment_name}: the paper's comparison served for real",
                      raw_cfg, ["## Measured and simulated\n\n" + markdown])  # fmt: skip
    if cfg.summary_table:
        print_files(output_dir)
    return table


def _warn_of_another_setup(profile_path: str, deployment: Deployment, decode_backend: str,
                          linear_backend: str) -> None:  # fmt: skip
    """Say so when the profile was fitted on another device, number of torch threads, decode
    backend or matmul library than these runs use: its absolute tokens/s then price another
    executor (its ratios may still compare)."""
    _, differences = checked_profile(profile_path, deployment, decode_backend, linear_backend)
    for difference in differences:
        print(f"paper_executed: warning: {profile_path} was fitted on {difference}: compare its "
              "ratios, not its absolute tokens/s")  # fmt: skip


def probe_machine(model: Any, setup: ServingSetup) -> dict[str, float]:
    """Each of ``PROBES``' measured time (median of ``PROBE_REPEATS``) over its price by
    ``setup``'s profile (none without one)."""
    from kvbench.tasks.profile.measure import time_iteration

    if setup.probe_cost_model is None:
        return {}
    ratios = {}
    for column, point in PROBES.items():
        shape, timing = time_iteration(model, point, PROBE_REPEATS, setup.decode_backend,
                                       setup.deployment.model.kv_dtype)  # fmt: skip
        ratios[column] = timing.median_s / setup.probe_cost_model.iteration_time_s(shape)
    return ratios


def serve_rounds(
    model: Any,
    requests: Sequence[Request],
    allocators: Sequence[str],
    rounds: int,
    setup: ServingSetup,
) -> pd.DataFrame:
    """Every allocator's real run of ``requests``, ``rounds`` times; round r starts at the
    r-th allocator (a rotation), so no allocator always runs first or last. Each run is bracketed
    by the machine probes, before and after it (one run's after is the next one's before), where
    ``setup`` has a profile to price them."""
    from kvbench.executors.real import RealExecutor, run_real

    rows = []
    probes_before = probe_machine(model, setup)
    for round_index in range(rounds):
        shift = round_index % len(allocators)
        for name in [*allocators[shift:], *allocators[:shift]]:
            allocator = make_allocator(name, setup.num_slots, setup.block_size,
                                       setup.max_model_len)  # fmt: skip
            executor = RealExecutor(model, allocator, setup.decode_backend,
                                    setup.deployment.model.kv_dtype)  # fmt: skip
            executor.warm_up(setup.limits)
            load_average_1m = os.getloadavg()[0]
            wall_start_s = time.perf_counter()
            served = run_real(requests, Scheduler(setup.limits), allocator, executor)
            wall_s = time.perf_counter() - wall_start_s
            probes_after = probe_machine(model, setup)  # and the next run's before
            # The machine's speed over the run, bracketed: a run takes minutes, over which this
            # shared machine's speed was seen to change by 10-20 %.
            probes = {column: (ratio + probes_after[column]) / 2
                      for column, ratio in probes_before.items()}  # fmt: skip
            probes_before = probes_after
            rows.append({"source": MEASURED, "allocator": name, "round": round_index,
                         **run_figures(served.result, setup.deployment),
                         "wall_s": wall_s,
                         "load_average_1m": load_average_1m,
                         "kv_pool_bytes": served.kv_pool_bytes, **probes})  # fmt: skip
            probed = "".join(f", {column.split('_over')[0]} {ratio:.2f}x the profile"
                             for column, ratio in probes.items())  # fmt: skip
            print(f"real: round {round_index + 1}/{rounds}, {name}: "
                  f"{rows[-1]['output_token_throughput']:.1f} output tokens/s, mean batch "
                  f"{rows[-1]['mean_batch_size']:.1f}{probed}", flush=True)  # fmt: skip
    return pd.DataFrame(rows)


def simulate_sources(
    requests: Sequence[Request],
    allocators: Sequence[str],
    sources: dict[str, CostModelFor],
    setup: ServingSetup,
) -> pd.DataFrame:
    """Every allocator's run of ``requests`` simulated with each source's cost model (at the
    allocator's kernel block size: 1 for a contiguous arena)."""
    rows = []
    for source, model_for in sources.items():
        for name in allocators:
            allocator = make_allocator(name, setup.num_slots, setup.block_size,
                                       setup.max_model_len)  # fmt: skip
            result = simulate(requests, Scheduler(setup.limits), allocator,
                              model_for(name, allocator.block_size))  # fmt: skip
            rows.append({"source": source, "allocator": name, "round": 0,
                         **run_figures(result, setup.deployment)})  # fmt: skip
    return pd.DataFrame(rows)
