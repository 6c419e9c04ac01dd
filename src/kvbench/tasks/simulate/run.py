"""One ``task=simulate`` run of the app: the grid of settings, then the sweep analyses.

``run_experiment`` replays every workload x rate x allocator of one setting. A study adds what
needs several settings or several rates:

- a grid over ``schedulers`` x ``block_sizes`` x ``preemption_modes`` (vLLM v0 vs v1; Fig. 18b,
  Fig. 19): one ``run_experiment`` per point, each in its own folder
  ``scheduler=NAME,block_size=B,preemption=MODE/`` (``scheduler=`` only when ``schedulers`` is
  set; like a Hydra multirun's jobs, so the report reads both the same way);
- knees of every rate sweep (Fig. 12) in ``knees.parquet`` and ``plots/latency_vs_rate``;
- latency vs block size (``plots/latency_vs_block_size``, ``plots/recompute_vs_swap``);
- with ``capacity.target_request_rate``: the fleet each allocator needs (``capacity.parquet``,
  ``plots/capacity_cost``), measured at its operating rate in ``operating/<allocator>/``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from kvbench.analysis.capacity import fleet_frame, with_fleet_memory
from kvbench.analysis.curves import knee_ratios, knees_frame
from kvbench.config import KvbenchConfig, SchedulerConfig
from kvbench.core.kv_capacity import deployment_startup_figures, hybrid_startup_figures
from kvbench.core.specs import Deployment
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.simulate.chart_processes import chart_processes
from kvbench.tasks.simulate.experiment import run_experiment, scheduler_limits
from kvbench.tasks.simulate.plot import plot_fleet, plot_sweeps
from kvbench.tasks.simulate.run_outputs import (
    hydra_command,
    print_run_summary,
    sub_report_link,
    write_run_report,
)
from kvbench.tasks.simulate.run_report import REPORT_NAME, Link

OPERATING_SUFFIX = "_operating"
# The folder holding the capacity analysis's measurements, one sub-folder per allocator.
OPERATING_DIR = "operating"
# Replicas added past the knee's count when the operating run misses the bound.
MAX_EXTRA_REPLICAS = 3


@dataclass(frozen=True)
class GridPoint:
    """One setting of the grid: a block size, a preemption mode, (for per-workload rate lists)
    the one workload it replays (None: every workload of the run) and (when the run compares
    ``schedulers``) the label of the scheduler it runs (None: ``scheduler``)."""

    block_size: int
    preemption: str
    workload: str | None = None
    scheduler: str | None = None

    @property
    def dir_name(self) -> str:
        """The point's folder, named like a Hydra multirun job's overrides."""
        name = f"block_size={self.block_size},preemption={self.preemption}"
        if self.workload is not None:
            name = f"workload={self.workload},{name}"
        return name if self.scheduler is None else f"scheduler={self.scheduler},{name}"


def is_grid(cfg: KvbenchConfig) -> bool:
    """Whether the run splits into grid points (else it is one ``run_experiment``)."""
    return bool(
        cfg.block_sizes or cfg.preemption_modes or cfg.workload_request_rates or cfg.schedulers
    )


def grid_points(cfg: KvbenchConfig) -> list[GridPoint]:
    """Every (scheduler, workload, preemption, block size) the run covers; one point when no list
    is set. A scheduler of ``schedulers`` brings its own preemption mode."""
    sizes = cfg.block_sizes or [cfg.allocator.block_size]
    workloads: list[str | None] = list(cfg.workload_request_rates) or [None]
    schedulers: dict[str | None, SchedulerConfig] = (
        dict(cfg.schedulers.items()) or {None: cfg.scheduler}
    )
    return [
        GridPoint(size, mode, workload, label)
        for label, scheduler in schedulers.items()
        for workload in workloads
        for mode in cfg.preemption_modes or [scheduler.preemption]
        for size in sizes
    ]


def point_config(
    cfg: KvbenchConfig, raw: DictConfig | None, point: GridPoint
) -> tuple[KvbenchConfig, DictConfig | None]:
    """``cfg`` (and its raw form, for provenance) set to one grid point."""
    scheduler = cfg.scheduler if point.scheduler is None else cfg.schedulers[point.scheduler]
    updates: dict[str, object] = {
        "allocator.block_size": point.block_size,
        "block_sizes": [],
        "preemption_modes": [],
        "workload_request_rates": {},
        "schedulers": {},
    }
    if point.scheduler is not None:
        updates["scheduler"] = _raw_node(raw, f"schedulers.{point.scheduler}")
    updates["scheduler.preemption"] = point.preemption
    typed = dataclasses.replace(
        cfg,
        allocator=dataclasses.replace(cfg.allocator, block_size=point.block_size),
        scheduler=dataclasses.replace(scheduler, preemption=point.preemption),
        block_sizes=[],
        preemption_modes=[],
        workload_request_rates={},
        schedulers={},
    )
    if point.workload is not None:
        rates = [float(rate) for rate in cfg.workload_request_rates[point.workload]]
        updates["request_rates"] = rates
        typed = dataclasses.replace(typed, request_rates=rates)
        if cfg.workloads:
            only = {point.workload: cfg.workloads[point.workload]}
            updates["workloads"] = {point.workload: _raw_node(raw, f"workloads.{point.workload}")}
            typed = dataclasses.replace(typed, workloads=only)
    return typed, _updated(raw, updates)


def _raw_node(raw: DictConfig | None, key: str) -> object:
    return None if raw is None else OmegaConf.to_container(OmegaConf.select(raw, key))


def _updated(raw: DictConfig | None, updates: dict[str, object]) -> DictConfig | None:
    if raw is None:
        return None
    copy = OmegaConf.create(OmegaConf.to_container(raw))
    for key, value in updates.items():
        OmegaConf.update(copy, key, value, merge=False, force_add=True)
    return copy  # type: ignore[return-value]


def run_study(
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw: DictConfig | None,
    output_dir: Path,
    num_chart_workers: int = 0,
) -> pd.DataFrame:
    """Run the grid (or the single setting), then the analyses; returns every summary row.

    ``num_chart_workers`` processes, started with the study, draw the charts beside the tables
    (``chart_processes``; 0: this process draws them, after the tables). The command line asks
    for them; a script calling this function need not guard its main module as ``multiprocessing``
    would require.

    Every run folder gets its ``report.md`` (a grid's root links its points'); then, unless
    ``summary_table=false``, the summary table and the files written are printed (and, first,
    the pool as vLLM v1 would log it at startup: the same blocks in its words, docs/referee.md).
    """
    if cfg.summary_table:
        figures = deployment_startup_figures(
            deployment, cfg.allocator.block_size, cfg.allocator.num_gpu_blocks
        )
        print(f"kvbench: as vLLM v1 would log this pool: {figures.log_line()}")
        hybrid_names = {"paged_hybrid", "paged_hybrid_prefix"}
        if hybrid_names & set(cfg.allocators) and deployment.model.is_hybrid:
            hybrid = hybrid_startup_figures(
                deployment, cfg.allocator.block_size,
                scheduler_limits(cfg, deployment).max_num_batched_tokens,
                cfg.allocator.num_gpu_blocks,
            )  # fmt: skip
            print(f"kvbench: as vLLM v1's hybrid KV-cache manager would log it (paged_hybrid): "
                  f"{hybrid.log_line()}")  # fmt: skip
    command = hydra_command(output_dir)
    points: list[Path] = []
    with chart_processes(num_chart_workers if cfg.plots else 0) as charts:
        if is_grid(cfg):
            summaries = []
            for point in grid_points(cfg):
                point_cfg, point_raw = point_config(cfg, raw, point)
                folder = output_dir / point.dir_name
                summaries.append(run_experiment(point_cfg, deployment, point_raw, folder))
                charts.wait()  # the report lists the point's charts
                parent = Link("the study", f"../{REPORT_NAME}")
                write_run_report(folder, point_cfg, deployment, point_raw, summaries[-1],
                                 command, parent=parent)  # fmt: skip
                points.append(folder)
            summary = pd.concat(summaries, ignore_index=True)
            plot_study_sweeps(cfg, summary, output_dir)
        else:
            # The sweep charts are handed out before the steps and requests tables are written,
            # so that they are drawn beside that write, not after it.
            summary = run_experiment(cfg, deployment, raw, output_dir,
                                     before_tables=partial(plot_study_sweeps, cfg,
                                                           output_dir=output_dir))  # fmt: skip
        write_analyses(cfg, deployment, raw, summary, output_dir)
        charts.wait()
    write_run_report(output_dir, cfg, deployment, raw, summary, command,
                     runs=sub_reports(output_dir, points))  # fmt: skip
    if cfg.summary_table:
        print_run_summary(summary, output_dir)
    return summary


def sub_reports(output_dir: Path, points: list[Path]) -> list[Link]:
    """Links to the reports of the run folders below ``output_dir``: the grid's ``points``, then
    the capacity analysis's operating points."""
    operating = output_dir / OPERATING_DIR
    folders = points + sorted(path.parent for path in operating.glob(f"*/{REPORT_NAME}"))
    return [sub_report_link(output_dir, folder) for folder in folders]


def write_analyses(
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw: DictConfig | None,
    summary: pd.DataFrame,
    output_dir: Path,
) -> None:
    """The knees table, and the capacity table and chart, where the run has them (its sweep
    charts: ``plot_study_sweeps``)."""
    metadata = provenance(raw)
    knees = study_knees(cfg, summary)
    if not knees.empty:
        write_table(knees, output_dir / "knees.parquet", metadata)
    fleet = None
    target = cfg.capacity.target_request_rate
    if target is not None:
        if knees.empty:
            raise ValueError("capacity.target_request_rate needs a rate sweep (request_rates)")
        fleet = _measured_fleet(cfg, deployment, raw, knees, target, output_dir)
        write_table(fleet, output_dir / "capacity.parquet", metadata)
    if cfg.plots and fleet is not None:
        plot_fleet(fleet, output_dir / "plots")


def study_knees(cfg: KvbenchConfig, summary: pd.DataFrame) -> pd.DataFrame:
    """Each allocator's knee on the study's rate sweep (empty without one)."""
    return knee_ratios(
        knees_frame(summary, cfg.knee.latency_multiple, cfg.knee.max_latency_s_per_token)
    )


def plot_study_sweeps(cfg: KvbenchConfig, summary: pd.DataFrame, output_dir: Path) -> None:
    """The study's charts across its runs (``plot_sweeps``), unless ``plots=false``."""
    if cfg.plots:
        plot_sweeps(summary, study_knees(cfg, summary), output_dir / "plots")


def _measured_fleet(
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw: DictConfig | None,
    knees: pd.DataFrame,
    target: float,
    output_dir: Path,
) -> pd.DataFrame:
    """The fleet per allocator, measured at its per-replica operating rate.

    The knee is interpolated between sampled rates, so a replica run at ``target / replicas``
    can land just over the bound: then one more replica is added and measured again.
    """
    price = cfg.hardware.price_per_gpu_hour
    price = float("nan") if price is None else price
    fleet = fleet_frame(knees, target, price)
    replicas: dict[int, float] = {}
    operating = []
    for position, row in enumerate(fleet.itertuples(index=False)):
        if row.replicas != row.replicas:  # NaN: the allocator cannot meet the bound at all
            continue
        def measure(count: int, row: object = row) -> pd.DataFrame:
            return _run_operating_point(cfg, deployment, raw, row, target / count, output_dir)

        count, measured = replicas_meeting_bound(measure, int(row.replicas),
                                                 row.latency_bound_s_per_token)  # fmt: skip
        replicas[position] = count
        operating.append(measured)
    fleet = fleet_frame(knees, target, price, replicas)
    if not operating:
        nan = float("nan")
        return fleet.assign(kv_pool_gb_fleet=nan, kv_held_gb=nan, kv_used_gb=nan,
                            operating_latency_s_per_token=nan, kv_held_over_used=nan)  # fmt: skip
    measured = pd.concat(operating, ignore_index=True).assign(experiment=cfg.experiment_name)
    return with_fleet_memory(fleet, measured)


def replicas_meeting_bound(
    measure: Callable[[int], pd.DataFrame], replicas: int, bound_s_per_token: float
) -> tuple[int, pd.DataFrame]:
    """The fewest replicas from ``replicas`` up (at most ``MAX_EXTRA_REPLICAS`` added) whose
    measured operating point (``measure(count)``, a summary row) is within the bound, and that
    measurement. If none is, the last count measured and its row (latency over the bound): the
    fleet row then says so, never a count that was not run."""
    for extra in range(MAX_EXTRA_REPLICAS + 1):
        count = replicas + extra
        measured = measure(count)
        if measured["normalized_latency_s_per_token"].iloc[0] <= bound_s_per_token:
            break
    return count, measured


def _label_of(cfg: KvbenchConfig, scheduler_name: str) -> str:
    """The label in ``schedulers`` of the scheduler named ``scheduler_name``."""
    return next(label for label, scheduler in cfg.schedulers.items()
                if scheduler.name == scheduler_name)  # fmt: skip


def _run_operating_point(
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw: DictConfig | None,
    row: object,
    rate: float,
    output_dir: Path,
) -> pd.DataFrame:
    """One allocator at one per-replica rate, in ``operating/<allocator>,<point>/``."""
    scheduler = getattr(row, "scheduler", None) if cfg.schedulers else None
    point = GridPoint(int(row.block_size), str(row.preemption),  # type: ignore[attr-defined]
                      scheduler=None if scheduler is None else _label_of(cfg, str(scheduler)))
    point_cfg, point_raw = point_config(cfg, raw, point)
    allocator = str(row.allocator)  # type: ignore[attr-defined]
    # A measurement for the capacity table: its charts would only repeat the sweep's.
    updates = {"request_rates": [float(rate)], "allocators": [allocator], "plots": False,
               "experiment_name": f"{cfg.experiment_name}{OPERATING_SUFFIX}"}  # fmt: skip
    point_cfg = dataclasses.replace(point_cfg, **updates)  # type: ignore[arg-type]
    folder = output_dir / OPERATING_DIR / f"{allocator},{point.dir_name}"
    operating_raw = _updated(point_raw, updates)
    measured = run_experiment(point_cfg, deployment, operating_raw, folder)
    write_run_report(folder, point_cfg, deployment, operating_raw, measured,
                     hydra_command(output_dir), parent=Link("the study", f"../../{REPORT_NAME}"))
    return measured
