"""A multirun's root ``report.md``: links to every job's report and their summaries in one table.

Hydra runs each job of ``python -m kvbench -m ...`` in its own folder (each writes its own
``report.md``); once all have returned, Hydra calls ``SweepIndex.on_multirun_end`` in the
launching process (``hydra.callbacks`` in ``conf/config.yaml``), which writes the sweep folder's
index. Jobs are the folders holding a DONE marker, so a re-run sweep's index lists the jobs of
every run into that folder.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kvbench.tables.atomic import write_text_atomic
from kvbench.tables.done_marker import DONE_NAME
from kvbench.tasks.simulate.run import OPERATING_DIR
from kvbench.tasks.simulate.run_outputs import output_files, report_provenance
from kvbench.tasks.simulate.run_report import REPORT_NAME, Link, RunReport, render_report

SUMMARY_NAME = "summary.parquet"


def job_folders(sweep_dir: Path) -> list[Path]:
    """The jobs of a sweep folder: every folder below it with a DONE marker."""
    return sorted(path.parent for path in sweep_dir.rglob(DONE_NAME) if path.parent != sweep_dir)


def job_summary(job: Path) -> pd.DataFrame:
    """A job's summary rows (a grid job's from its points), labelled with the job's folder."""
    # The capacity analysis's measurements are not rows of the sweep.
    tables = [path for path in sorted(job.rglob(SUMMARY_NAME))
              if OPERATING_DIR not in path.relative_to(job).parts]  # fmt: skip
    if not tables:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(path) for path in tables], ignore_index=True)


def sweep_summary(jobs: list[Path]) -> pd.DataFrame:
    """Every job's summary rows, with a ``job`` column: the job's number in the index (from 1)."""
    frames = [job_summary(job).assign(job=number) for number, job in enumerate(jobs, start=1)]
    frames = [frame for frame in frames if "allocator" in frame.columns]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def write_sweep_index(sweep_dir: Path, command: str = "") -> Path:
    """``sweep_dir/report.md``: the jobs' reports linked, their summaries in one table."""
    jobs = job_folders(sweep_dir)
    summary = sweep_summary(jobs)
    name = summary["experiment"].iloc[0] if not summary.empty else sweep_dir.name
    aggregate = f"python -m kvbench.tasks.report {shlex.quote(str(sweep_dir))} --out REPORT_DIR"
    files = [entry for entry in output_files(sweep_dir, expanded=()) if entry.path != REPORT_NAME]
    report = RunReport(
        title=f"{name}: a sweep of {len(jobs)} jobs",
        summary=summary,
        provenance=report_provenance(None, command),
        intro=[f"Each job's folder has its own `{REPORT_NAME}` (its charts, config and "
               f"provenance); `{aggregate}` aggregates the jobs into tables, knees and charts."],
        runs=[job_link(sweep_dir, number, job) for number, job in enumerate(jobs, start=1)],
        runs_heading="Jobs",
        files=files,
    )  # fmt: skip
    return write_text_atomic(sweep_dir / REPORT_NAME, render_report(report))


def job_link(sweep_dir: Path, number: int, job: Path) -> Link:
    """The index's link to job ``number``: its report, or its folder when it has none."""
    relative = job.relative_to(sweep_dir).as_posix()
    target = f"{relative}/{REPORT_NAME}" if (job / REPORT_NAME).is_file() else relative
    return Link(f"job {number}: {relative}", target)


def sweep_command(config: DictConfig) -> str:
    """The multirun's command line, from Hydra's record of its overrides."""
    overrides = list(config.hydra.overrides.task)
    return " ".join(["python -m kvbench -m", *(shlex.quote(str(item)) for item in overrides)])


class SweepIndex(Callback):
    """Hydra callback: the sweep folder's ``report.md`` once every job has returned."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the index into ``hydra.sweep.dir``."""
        write_sweep_index(Path(config.hydra.sweep.dir), sweep_command(config))
