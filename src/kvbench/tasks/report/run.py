"""Build the report: aggregated tables, charts and the reproduction markdown; over
``sim_to_real`` and ``sim_to_vllm`` runs, their errors across runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.analysis.curves import knee_ratios, knee_sensitivity, knees_frame
from kvbench.core.packaged_conf import root_setting
from kvbench.tables.parquet import write_table
from kvbench.tables.provenance import provenance
from kvbench.tasks.report import sections
from kvbench.tasks.report.aggregate import done_marker, load_tables
from kvbench.tasks.report.docs_blocks import block, replace_blocks
from kvbench.tasks.report.plot import draw_report_figures
from kvbench.tasks.report.sim_to_real_runs import (
    ENGINE_TABLES,
    STEPS_TABLES,
    repeat_split_runs_section,
    sim_to_real_runs_section,
)

# The app's knee bound (conf/config.yaml), for knees recomputed over every run.
DEFAULT_LATENCY_MULTIPLE = float(root_setting("knee.latency_multiple"))
REFERENCE_DIR = "results/reference"
PAPER_SCHEDULER = "vllm_v0"


@dataclass
class ReportTables:
    """Everything the report computed from the result folders."""

    summary: pd.DataFrame
    knees: pd.DataFrame
    sensitivity: pd.DataFrame
    capacity: pd.DataFrame
    # Per engine table file (sim_to_real.parquet, sim_to_vllm.parquet): every run's rows.
    sim_to_real: dict[str, pd.DataFrame]

    @property
    def empty(self) -> bool:
        """Nothing found under the folders: no summary and no sim-to-real rows."""
        return self.summary.empty and all(t.empty for t in self.sim_to_real.values())


def compute_tables(
    roots: list[Path], latency_multiple: float = DEFAULT_LATENCY_MULTIPLE
) -> ReportTables:
    """Load every summary and capacity table under ``roots`` (the paper's engine's rows: see
    ``paper_engine_rows``), recompute knees over all runs; load every sim-to-real table."""
    summary = paper_engine_rows(load_tables(roots, "summary.parquet"))
    capacity = paper_engine_rows(load_tables(roots, "capacity.parquet"))
    sim_to_real = {name: load_tables(roots, name) for name, _, _ in ENGINE_TABLES}
    if summary.empty:
        return ReportTables(summary, pd.DataFrame(), pd.DataFrame(), capacity, sim_to_real)
    knees = knee_ratios(knees_frame(summary, latency_multiple))
    sensitivity = knee_sensitivity(summary) if not knees.empty else pd.DataFrame()
    return ReportTables(summary, knees, sensitivity, capacity, sim_to_real)


def paper_engine_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``table`` run by the paper's engine (``scheduler=vllm_v0``; tables written
    before the ``scheduler`` column were all its): the reproduction compares the paper's figures.
    Experiments that also run ``vllm_v1`` (sharegpt_70b, capacity_cost) show both in their own
    run folders (report.md, plots/scheduler_comparison)."""
    if "scheduler" not in table.columns:
        return table
    paper = table["scheduler"].isna() | (table["scheduler"] == PAPER_SCHEDULER)
    return table[paper].reset_index(drop=True)


def section_bodies(tables: ReportTables) -> dict[str, str]:
    """Each figure's markdown, keyed by the block name it fills in docs/reproduction.md."""
    done = {
        run_dir: marker
        for run_dir in tables.summary.get("run_dir", pd.Series(dtype=str)).unique()
        if (marker := done_marker(Path(run_dir))) is not None
    }
    return {
        "table1": sections.table1_section(),
        "fig2": sections.fig2_section(tables.summary),
        "fig13": sections.fig13_section(tables.summary),
        "fig12": sections.fig12_section(tables.summary, tables.knees, tables.sensitivity),
        "fig18b": sections.fig18b_section(tables.summary),
        "fig19": sections.fig19_section(tables.summary),
        "fig15": sections.fig15_section(tables.summary, tables.knees),
        "prefix_caching": sections.prefix_caching_section(tables.summary),
        "radix_offload": sections.radix_offload_section(tables.summary),
        "capacity": sections.capacity_section(tables.capacity),
        "runs": sections.runs_section(tables.summary, done),
    }


def write_report(
    roots: list[Path], out_dir: Path, docs_path: Path | None = None
) -> ReportTables:
    """Write ``results.parquet``, ``knees.parquet``, ``capacity.parquet``, the charts and
    ``reproduction.md`` under ``out_dir`` (from summaries), and ``sim_to_real_runs.md`` (from
    sim-to-real tables, and their steps tables where a run kept them); with ``docs_path``,
    refresh its generated blocks."""
    tables = compute_tables(roots)
    if tables.empty:
        return tables
    out_dir.mkdir(parents=True, exist_ok=True)
    bodies = _write_reproduction(tables, out_dir) if not tables.summary.empty else {}
    runs_body = sim_to_real_runs_section(tables.sim_to_real)
    if runs_body:
        # A run's steps table sits beside its sim_to_real / sim_to_vllm table: read only then.
        steps = {name: load_tables(roots, name) for name, _ in STEPS_TABLES}
        runs_body = "\n\n".join(part for part in (runs_body, repeat_split_runs_section(steps))
                                  if part)  # fmt: skip
        bodies["sim_to_real_runs"] = runs_body
        (out_dir / "sim_to_real_runs.md").write_text(
            "# kvbench sim-to-real errors across runs\n\n" + block("sim_to_real_runs", runs_body)
            + "\n")  # fmt: skip
    if docs_path is not None:
        _refresh_docs(docs_path, bodies)
    return tables


def _write_reproduction(tables: ReportTables, out_dir: Path) -> dict[str, str]:
    """The summaries' tables, charts and ``reproduction.md``; returns its blocks' bodies."""
    metadata = provenance(None)
    for name, frame in (("results", tables.summary), ("knees", tables.knees),
                        ("capacity", tables.capacity)):  # fmt: skip
        if not frame.empty:
            write_table(frame, out_dir / f"{name}.parquet", metadata)
    draw_report_figures(tables.summary, tables.knees, tables.capacity, out_dir)
    bodies = {name: body for name, body in section_bodies(tables).items() if body}
    text = "# kvbench reproduction report\n\n" + "\n\n".join(
        block(name, body) for name, body in bodies.items()
    )
    (out_dir / "reproduction.md").write_text(text + "\n")
    return bodies


def _refresh_docs(docs_path: Path, bodies: dict[str, str]) -> list[str]:
    """Rewrite the generated blocks of ``docs_path`` that the results filled."""
    text, missing = replace_blocks(docs_path.read_text(), bodies)
    docs_path.write_text(text)
    return missing
