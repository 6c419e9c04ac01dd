"""The end of a simulate run, at the edge: ``report.md`` in its folder, the summary in the
terminal. The text is rendered by the pure ``run_summary`` and ``run_report``; this module walks
the folder, reads what Hydra recorded, writes and prints.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import DictConfig, OmegaConf

from kvbench.config import KvbenchConfig
from kvbench.core.specs import Deployment
from kvbench.tables.atomic import write_text_atomic
from kvbench.tables.provenance import provenance
from kvbench.tasks.simulate.run_report import REPORT_NAME, Link, RunReport, render_report
from kvbench.tasks.simulate.run_summary import FileEntry, files_text, rate_text, summary_text

PLOTS_DIR = "plots"
# Where Hydra records the command line's overrides of a run (or a multirun job).
HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"
GB = 1e9


def output_files(folder: Path, expanded: Sequence[str] = (PLOTS_DIR,)) -> list[FileEntry]:
    """The files of a run folder: its own, then those of the ``expanded`` sub-folders, then each
    other sub-folder (grid points, streamed tables, operating points) as one entry. Hidden
    entries (``.hydra/``, temporary files) are left out."""
    files: list[FileEntry] = []
    folders: list[FileEntry] = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_file():
            files.append(FileEntry(path.name, path.stat().st_size))
        elif path.is_dir() and path.name in expanded:
            files += [FileEntry(f"{path.name}/{inner.name}", inner.stat().st_size)
                      for inner in sorted(path.iterdir())
                      if inner.is_file() and not inner.name.startswith(".")]  # fmt: skip
        elif path.is_dir():
            inner_files = [inner for inner in path.rglob("*")
                           if inner.is_file() and not inner.name.startswith(".")]  # fmt: skip
            size = sum(inner.stat().st_size for inner in inner_files)
            folders.append(FileEntry(f"{path.name}/", size, len(inner_files)))
    return files + folders


def chart_paths(folder: Path) -> list[str]:
    """The PNG charts in ``folder/plots``, relative to ``folder`` (SVG or PDF twins, where
    ``plot_formats`` asked for them, are beside them)."""
    plots = folder / PLOTS_DIR
    if not plots.is_dir():
        return []
    return [f"{PLOTS_DIR}/{path.name}" for path in sorted(plots.glob("*.png"))]


def hydra_command(folder: Path) -> str:
    """The command that made the run, from Hydra's record of its overrides ('' without one)."""
    path = folder / HYDRA_OVERRIDES
    if not path.is_file():
        return ""
    overrides = yaml.safe_load(path.read_text()) or []
    return " ".join(["python -m kvbench", *(shlex.quote(str(item)) for item in overrides)])


def report_provenance(raw: DictConfig | None, command: str) -> dict[str, str]:
    """Version and commit (as every table's), the time the report was written, the command."""
    return {
        **provenance(raw),
        "written_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": command,
    }


def config_yaml(cfg: KvbenchConfig, raw: DictConfig | None) -> str:
    """The resolved config: Hydra's composed one when given, else the typed one."""
    if raw is not None:
        return OmegaConf.to_yaml(raw, resolve=True)
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


# executor=profiled's counts of what its profile prices by extrapolation, per workload (the
# most of its runs), as report.md words them.
BEYOND_PROFILE_LINES = (
    ("requests_beyond_profile_pct",
     "requests longer than any sequence the profile timed, whose prices extrapolate it"),
    ("steps_beyond_profile_pct",
     "steps larger than every step the profile timed, priced by extrapolating it"),
)


def deployment_lines(deployment: Deployment, summary: pd.DataFrame) -> list[str]:
    """The report's opening lines: the deployment and its KV pool, the workloads, the runs."""
    model = deployment.model
    pool_gb = deployment.slots_to_bytes(deployment.num_kv_slots) / GB
    lines = [
        f"- deployment: {model.name} ({model.dtype}) on {deployment.num_gpus}x "
        f"{deployment.hardware.name}; KV pool {pool_gb:,.1f} GB = "
        f"{deployment.num_kv_slots:,} token slots of {deployment.kv_bytes_per_token:,} B",
    ]
    if summary.empty:
        return lines
    per_workload = summary.groupby("workload", sort=False)["num_requests"].max()
    lines.append("- workloads: " + ", ".join(
        f"{name} ({int(count):,} requests)" for name, count in per_workload.items()))  # fmt: skip
    rates = ", ".join(rate_text(rate) for rate in summary["request_rate"].unique())
    lines.append(f"- allocators: {', '.join(summary['allocator'].unique())}; request rates: "
                 f"{rates} req/s")  # fmt: skip
    for column, words in BEYOND_PROFILE_LINES:
        if column in summary:
            beyond = summary.groupby("workload", sort=False)[column].max()
            flagged = [f"{name} {pct:.1f} %" for name, pct in beyond.items() if pct > 0]
            if flagged:
                lines.append(f"- {words} (`{column}`): " + ", ".join(flagged))
    return lines


def write_run_report(
    folder: Path,
    cfg: KvbenchConfig,
    deployment: Deployment,
    raw: DictConfig | None,
    summary: pd.DataFrame,
    command: str = "",
    runs: Sequence[Link] = (),
    parent: Link | None = None,
) -> Path:
    """``folder/report.md`` for a run (or a grid's root, linking its ``runs``; a grid point
    links its ``parent``), atomically."""
    notes = [] if cfg.plots else ["Charts were not drawn (`plots=false`)."]
    intro = deployment_lines(deployment, summary)
    if parent is not None:
        intro.insert(0, f"One run of [{parent.label}]({parent.path}).\n")
    report = RunReport(
        title=f"{cfg.experiment_name}: {deployment.model.name} on {deployment.num_gpus}x "
        f"{deployment.hardware.name}",
        summary=summary,
        provenance=report_provenance(raw, command or hydra_command(folder)),
        config_yaml=config_yaml(cfg, raw),
        intro=intro,
        charts=chart_paths(folder),
        runs=runs,
        files=[entry for entry in output_files(folder) if entry.path != REPORT_NAME],
        notes=notes,
    )
    return write_text_atomic(folder / REPORT_NAME, render_report(report))


def write_task_report(
    folder: Path, title: str, raw: DictConfig | None, sections: Sequence[str]
) -> Path:
    """``folder/report.md`` for a task other than simulate: its own ``sections`` (its headline
    table), its charts, files, resolved config and provenance."""
    report = RunReport(
        title=title,
        summary=pd.DataFrame(),
        provenance=report_provenance(raw, hydra_command(folder)),
        config_yaml="" if raw is None else OmegaConf.to_yaml(raw, resolve=True),
        sections=sections,
        charts=chart_paths(folder),
        files=[entry for entry in output_files(folder) if entry.path != REPORT_NAME],
    )
    return write_text_atomic(folder / REPORT_NAME, render_report(report))


def sub_report_link(root: Path, folder: Path) -> Link:
    """A link from ``root``'s report to the report in ``folder`` below it."""
    relative = folder.relative_to(root).as_posix()
    return Link(relative, f"{relative}/{REPORT_NAME}")


def print_run_summary(summary: pd.DataFrame, folder: Path) -> None:
    """The summary table, then the output folder and its files, on stdout."""
    table = summary_text(summary)
    if table:
        print("\n" + table)
    print_files(folder)


def print_files(folder: Path) -> None:
    """The output folder and its files, on stdout."""
    print("\n" + files_text(shown_path(folder), output_files(folder)), flush=True)


def shown_path(folder: Path) -> str:
    """``folder`` as the user named it: relative to the working directory when below it."""
    absolute = folder.resolve()
    try:
        return absolute.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(absolute)
