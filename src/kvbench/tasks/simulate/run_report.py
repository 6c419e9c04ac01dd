"""A run folder's ``report.md``: the run told in one file that travels with its folder.

Pure: ``render_report`` turns a ``RunReport`` (what the edge gathered: the summary, the charts
the run drew, the linked sub-runs, the files, the resolved config, the provenance) into markdown.
Charts and sub-reports are linked by paths relative to the report, so the folder can be zipped,
moved or put in a repository and still read. ``tasks.simulate.run_outputs`` writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

import pandas as pd

from kvbench.tasks.simulate.run_summary import (
    FileEntry,
    entry_size_text,
    legend_text,
    markdown_summary_table,
    summary_cells,
)

REPORT_NAME = "report.md"

# What each chart of a simulate run shows, in the order the report puts them; a chart the
# report does not know comes after these, under its file name.
CHART_CAPTIONS = {
    "headline": "The headline: the share of the KV memory each allocator holds that stores tokens "
    "(the paper's Fig. 2 measure), GB held vs used, batch and throughput, at the rate where "
    "memory binds",
    "usage_breakdown": "KV memory breakdown per allocator: token states, reservation, internal "
    "and external fragmentation, free (the vLLM paper's Fig. 2)",
    "memory_over_time": "KV memory over time, per category",
    "batch_size": "Mean batch size per allocator (the paper's Fig. 13)",
    "latency_vs_rate": "Normalized latency vs request rate, with each allocator's knee "
    "(the paper's Fig. 12)",
    "latency_vs_block_size": "Normalized latency vs block size (the paper's Fig. 18b)",
    "recompute_vs_swap": "Recompute vs swap over block sizes (the paper's Fig. 19)",
    "capacity_cost": "GPUs, cost and KV memory held vs used per allocator for the target rate",
    "kv_budget": "The KV cache against the weights as context and batch grow: where KV overtakes "
    "them, per allocator",
}


@dataclass(frozen=True)
class Link:
    """A linked run: its label and the path of its report (or folder), relative to this one."""

    label: str
    path: str


@dataclass(frozen=True)
class RunReport:
    """Everything ``report.md`` says about a run folder; empty parts are left out."""

    title: str
    summary: pd.DataFrame
    provenance: dict[str, str]
    config_yaml: str = ""
    intro: Sequence[str] = ()
    # Markdown blocks of a task's own (its headline table), after the summary, before the charts.
    sections: Sequence[str] = ()
    charts: Sequence[str] = ()  # image paths relative to the report
    runs: Sequence[Link] = ()
    runs_heading: str = "Runs"
    files: Sequence[FileEntry] = ()
    notes: Sequence[str] = ()


def ordered_charts(paths: Sequence[str]) -> list[str]:
    """Chart paths in the report's order: the known charts first (``CHART_CAPTIONS``), then the
    others by name."""
    known = list(CHART_CAPTIONS)

    def key(path: str) -> tuple[int, str]:
        stem = PurePosixPath(path).stem
        return (known.index(stem) if stem in known else len(known), path)

    return sorted(paths, key=key)


def chart_caption(path: str) -> str:
    """What a chart shows, from its file name."""
    stem = PurePosixPath(path).stem
    return CHART_CAPTIONS.get(stem, stem.replace("_", " "))


def render_report(report: RunReport) -> str:
    """The markdown of ``report.md``."""
    parts = [f"# {report.title}"]
    if report.intro:
        parts.append("\n".join(report.intro))
    if not report.summary.empty:
        parts.append("## Summary\n\n" + markdown_summary_table(summary_cells(report.summary))
                     + "\n\n" + legend_text())  # fmt: skip
    parts.extend(report.sections)
    if report.charts:
        parts.append("## Charts\n\n" + "\n\n".join(
            f"**{chart_caption(path)}**\n\n![{PurePosixPath(path).stem}]({_link(path)})"
            for path in ordered_charts(report.charts)))  # fmt: skip
    parts.extend(report.notes)
    if report.runs:
        parts.append(f"## {report.runs_heading}\n\n" + "\n".join(
            f"- [{run.label}]({_link(run.path)})" for run in report.runs))  # fmt: skip
    if report.files:
        parts.append("## Files\n\n" + _files_table(report.files))
    if report.config_yaml:
        parts.append("## Configuration (resolved)\n\n```yaml\n" + report.config_yaml.rstrip()
                     + "\n```")  # fmt: skip
    parts.append("## Provenance\n\n" + _provenance_table(report.provenance))
    return "\n\n".join(parts) + "\n"


def _link(path: str) -> str:
    """A relative link target: spaces and parentheses escaped, so names such as
    ``block_size=16,preemption=swap`` or ``a b`` stay one link."""
    return path.replace(" ", "%20").replace("(", "%28").replace(")", "%29")


def _files_table(files: Sequence[FileEntry]) -> str:
    lines = ["| file | size |", "|---|---:|"]
    lines += [f"| `{entry.path}` | {entry_size_text(entry)} |" for entry in files]
    return "\n".join(lines)


PROVENANCE_LABELS = {
    "kvbench_version": "kvbench version",
    "git_commit": "git commit",
    "written_at": "written",
    "command": "command",
}


def _provenance_table(provenance: dict[str, str]) -> str:
    lines = ["| | |", "|---|---|"]
    for key, label in PROVENANCE_LABELS.items():
        if provenance.get(key):
            lines.append(f"| {label} | `{provenance[key]}` |")
    return "\n".join(lines)
