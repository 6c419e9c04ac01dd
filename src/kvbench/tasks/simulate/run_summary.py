"""What a simulate run found, as text: the summary table printed at the end of a run (and put in
its ``report.md``), and the listing of the files it wrote.

Pure: a summary frame (``summary.parquet``'s columns, ``docs/metrics.md``) in, strings out. The
printing and the folder walk are the caller's (``tasks.simulate.run_outputs``).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

# Labels shown only when they differ between the summary's rows (a sweep's jobs, a grid, several
# workloads).
VARYING_LABELS = ("job", "scheduler", "workload", "block_size", "preemption", "n", "beam_width")
# Width the legend under the table is wrapped to (the table itself stays under ~110 columns).
LEGEND_WIDTH = 100
COLUMN_GAP = "  "


@dataclass(frozen=True)
class Column:
    """One column of the summary table: a two-line header (group, then name and unit)."""

    group: str
    name: str

    @property
    def title(self) -> str:
        """The header on one line (markdown)."""
        return f"{self.group} {self.name}".strip()


@dataclass(frozen=True)
class SummaryCells:
    """The summary table as text cells, one row per run (allocator x rate x varying labels)."""

    columns: list[Column]
    rows: list[list[str]]
    # Leading columns that hold labels (left-aligned); the rest are figures (right-aligned).
    num_label_columns: int


@dataclass(frozen=True)
class FileEntry:
    """A file a run wrote (``num_files == 1``), or a folder of them shown as one line."""

    path: str  # relative to the run folder, POSIX; a folder ends with "/"
    size_bytes: int
    num_files: int = 1


def summary_cells(summary: pd.DataFrame) -> SummaryCells:
    """The table's cells: per row, the allocator, the rate, the labels that vary, the share of
    held memory storing tokens, held and used GB, mean batch, throughput, TTFT and TPOT p50/p99,
    rejected requests."""
    labels = [name for name in VARYING_LABELS
              if name in summary.columns and summary[name].nunique(dropna=False) > 1]  # fmt: skip
    columns = [Column("", "allocator"), Column("rate", "req/s")]
    columns += [Column("", name) for name in labels]
    columns += [
        Column("tokens", "% held"), Column("held", "GB"), Column("used", "GB"),
        Column("mean", "batch"), Column("done", "req/s"),
        Column("TTFT", "p50 s"), Column("TTFT", "p99 s"),
        Column("TPOT", "p50 ms"), Column("TPOT", "p99 ms"), Column("", "rejected"),
    ]  # fmt: skip
    rows = []
    for row in summary.itertuples(index=False):
        values = row._asdict()
        cells = [str(values["allocator"]), rate_text(values["request_rate"])]
        cells += [str(values[name]) for name in labels]
        cells += [
            _fixed(values["token_states_pct_of_held"], 1),
            _three_figures(values["kv_held_gb"]),
            _three_figures(values["token_states_gb"]),
            _fixed(values["mean_batch_size"], 1),
            _three_figures(values["request_throughput"]),
            _three_figures(values["ttft_p50_s"]),
            _three_figures(values["ttft_p99_s"]),
            _three_figures(values["tpot_p50_s"] * 1000),
            _three_figures(values["tpot_p99_s"] * 1000),
            str(int(values["num_rejected"])),
        ]
        rows.append(cells)
    return SummaryCells(columns, rows, num_label_columns=2 + len(labels))


def rate_text(rate: object) -> str:
    """A request rate as the table shows it: ``trace`` for 0 (the trace's own timestamps)."""
    if rate is None or (isinstance(rate, float) and math.isnan(rate)):
        return "-"
    value = float(rate)  # type: ignore[arg-type]
    return "trace" if value == 0 else f"{value:g}"


def _fixed(value: float, digits: int) -> str:
    return "-" if _missing(value) else f"{value:.{digits}f}"


def _three_figures(value: float) -> str:
    """About three significant figures without exponents: 155, 12.3, 1.23, 0.123, 0.0123."""
    if _missing(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100 or magnitude == 0:
        return f"{value:,.0f}"
    digits = 2 - math.floor(math.log10(magnitude))
    return f"{value:.{digits}f}"


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fixed_width_table(cells: SummaryCells) -> str:
    """The cells as a plain-text table with a two-line header (for the terminal)."""
    widths = [
        max(len(column.group), len(column.name), *(len(row[i]) for row in cells.rows))
        for i, column in enumerate(cells.columns)
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.ljust(width) if i < cells.num_label_columns else value.rjust(width)
            for i, (value, width) in enumerate(zip(values, widths, strict=True))
        ]
        return COLUMN_GAP.join(parts).rstrip()

    header = [line([column.group for column in cells.columns]),
              line([column.name for column in cells.columns])]  # fmt: skip
    return "\n".join(header + [line(row) for row in cells.rows])


def markdown_summary_table(cells: SummaryCells) -> str:
    """The cells as a GitHub markdown table (for ``report.md``)."""
    align = ["---" if i < cells.num_label_columns else "---:" for i in range(len(cells.columns))]
    lines = ["| " + " | ".join(column.title for column in cells.columns) + " |",
             "|" + "|".join(align) + "|"]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in cells.rows]
    return "\n".join(lines)


def summary_title(summary: pd.DataFrame) -> str:
    """One line: experiment, deployment, workloads, number of runs and the KV pool."""
    first = summary.iloc[0]
    workloads = ", ".join(str(name) for name in summary["workload"].unique())
    pools = summary["kv_pool_gb"].unique()
    pool = f"{pools[0]:,.1f} GB" if len(pools) == 1 else f"{pools.min():,.1f}-{pools.max():,.1f} GB"
    return (f"{first['experiment']}: {first['model']} on {int(first['num_gpus'])}x "
            f"{first['hardware']}, {workloads}, {len(summary)} runs, KV pool {pool}")  # fmt: skip


LEGEND = (
    "tokens % held: share of the KV memory an allocator holds (pool - free) that stores tokens "
    "(the vLLM paper's Fig. 2 measure); held / used GB: KV memory held and storing tokens, "
    "time-weighted means; mean batch: sequences per iteration; done req/s: finished requests "
    "per second; TTFT: time to first token; TPOT: time per output token after the first; "
    "rejected: requests that can never run."
)


def legend_text(width: int = LEGEND_WIDTH) -> str:
    """What each column holds, wrapped to ``width`` (definitions: ``docs/metrics.md``)."""
    return textwrap.fill(LEGEND, width)


def summary_text(summary: pd.DataFrame) -> str:
    """The terminal summary: a title line, the table and its legend ('' for no rows)."""
    if summary.empty:
        return ""
    return "\n".join([summary_title(summary), "",
                      fixed_width_table(summary_cells(summary)), "", legend_text()])  # fmt: skip


def size_text(num_bytes: int) -> str:
    """A file size in decimal units: 512 B, 35.1 kB, 4.3 MB, 1.2 GB."""
    size = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{num_bytes} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def entry_size_text(entry: FileEntry) -> str:
    """A listed entry's size: a file's, or a folder's file count and total."""
    size = size_text(entry.size_bytes)
    return f"{entry.num_files} files, {size}" if entry.path.endswith("/") else size


def files_text(output_dir: str, files: Sequence[FileEntry]) -> str:
    """The output folder and the files in it, one per line with its size."""
    sizes = [entry_size_text(entry) for entry in files]
    path_width = max((len(entry.path) for entry in files), default=0)
    size_width = max((len(size) for size in sizes), default=0)
    lines = [f"results in {output_dir}"]
    lines += [f"  {entry.path.ljust(path_width)}  {size.rjust(size_width)}"
              for entry, size in zip(files, sizes, strict=True)]  # fmt: skip
    return "\n".join(lines)
