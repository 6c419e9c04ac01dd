"""The report's charts, drawn from the aggregated tables with the package's plot functions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.analysis.curves import curve_keys
from kvbench.plots.capacity_chart import plot_capacity
from kvbench.plots.kv_designs_chart import kv_designs_rows, plot_kv_designs
from kvbench.plots.prefix_tiers import cpu_tier_chart, page_size_chart
from kvbench.plots.run_charts import plot_batch_sizes, plot_breakdown
from kvbench.plots.sweep_charts import plot_latency_vs_block_size, plot_latency_vs_rate
from kvbench.tasks.report.sections import block_sweep_rows, paper_point_rows, radix_offload_rows


def curves_with_knees(summary: pd.DataFrame, knees: pd.DataFrame) -> pd.DataFrame:
    """The summary rows that belong to a curve with a knee (rate sweeps only)."""
    if knees.empty:
        return summary.iloc[0:0]
    keys = [*curve_keys(knees), "allocator"]
    return summary.merge(knees[keys].drop_duplicates(), on=keys, how="inner")


def draw_report_figures(
    summary: pd.DataFrame, knees: pd.DataFrame, capacity: pd.DataFrame, out_dir: Path
) -> list[Path]:
    """Every chart the results support, under ``out_dir``; returns the PNG paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = curves_with_knees(summary, knees)
    for experiment, experiment_curves in curves.groupby("experiment", sort=False):
        plot_latency_vs_rate(experiment_curves, knees[knees["experiment"] == experiment],
                             out_dir, f"latency_vs_rate_{experiment}")  # fmt: skip
    block_sizes = block_sweep_rows(summary, compares_preemption=False)
    if not block_sizes.empty:
        plot_latency_vs_block_size(block_sizes, out_dir, "latency_vs_block_size")
    preemption = block_sweep_rows(summary, compares_preemption=True)
    if not preemption.empty:
        plot_latency_vs_block_size(preemption, out_dir, "recompute_vs_swap")
    if not capacity.empty:
        plot_capacity(capacity.drop_duplicates("allocator", keep="last"), out_dir)
    radix_offload = radix_offload_rows(summary)
    if not radix_offload.empty:
        page_size_chart(radix_offload[radix_offload["policy"] == "fcfs"], out_dir)
        cpu_tier_chart(radix_offload[radix_offload["policy"] == "fcfs"], out_dir, "mooncake")
    for experiment in summary["experiment"].unique():
        if str(experiment).startswith("kv_designs"):  # kv_designs, kv_designs_70b
            runs = summary[summary["experiment"] == experiment]
            first = runs.iloc[0]
            plot_kv_designs(kv_designs_rows(runs, knees[knees["experiment"] == experiment]),
                            out_dir, f"designs_{experiment}",
                            f"{experiment}: {first['model']} on {first['num_gpus']}x "
                            f"{first['hardware']}")  # fmt: skip
    fig2 = paper_point_rows(summary)
    if not fig2.empty:
        plot_breakdown(fig2[fig2["workload"] == "sharegpt"], out_dir, with_paper=True)
        plot_batch_sizes(fig2, out_dir, with_paper=True)
    return sorted(out_dir.glob("*.png"))
