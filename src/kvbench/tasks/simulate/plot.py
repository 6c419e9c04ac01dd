"""The charts a simulate run draws: each setting's (the headline, Fig. 2 breakdown, memory over
time, Fig. 13 batch sizes, the KV budget), the study's sweeps (Fig. 12 knees, Fig. 18b/19 block
sizes, v0 vs v1) and its capacity analysis.

Charts are named by their function's dotted path (``chart_processes.ChartDrawer.draw``), and their
modules (and matplotlib, a third of a second to import) are imported where a chart is drawn: a
run with ``plots=false`` never loads them, and a run whose charts go to worker processes loads
them there only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvbench.core.specs import Deployment
from kvbench.tasks.simulate.chart_processes import drawer


def mean_context_tokens(summary: pd.DataFrame, deployment: Deployment) -> int:
    """Tokens per running sequence, on time average, of the allocator that batched the most at
    the headline rate: ``token_states_gb x 10^9 / kv_bytes_per_token / mean_batch_size``."""
    from kvbench.plots.headline_chart import headline_rows

    rows = headline_rows(summary)
    best = rows.loc[rows["mean_batch_size"].idxmax()]
    tokens = best["token_states_gb"] * 1e9 / deployment.kv_bytes_per_token
    return max(1, round(tokens / max(best["mean_batch_size"], 1e-9)))


def plot_kv_budget_of_run(
    summary: pd.DataFrame, deployment: Deployment, max_num_seqs: int, out_dir: Path
) -> None:
    """``kv_budget`` at the run's block size and mean context (``mean_context_tokens``)."""
    from kvbench.plots.kv_budget_chart import plot_kv_budget

    block_size = int(summary["block_size"].iloc[0])
    context_tokens = mean_context_tokens(summary, deployment)
    plot_kv_budget(deployment, max_num_seqs, context_tokens, block_size, out_dir)


def plot_run(
    summary: pd.DataFrame,
    steps: pd.DataFrame,
    out_dir: Path,
    deployment: Deployment | None = None,
    max_num_seqs: int | None = None,
) -> None:
    """Every chart of one run; the paper's bars appear for OPT-13B runs (its Fig. 2/13 setup).

    With ``deployment`` and ``max_num_seqs`` (the scheduler's cap) it adds ``kv_budget``: that
    many sequences of a growing context, and sequences of the run's mean context growing in
    number. Each chart is drawn by ``chart_processes.drawer()`` (here or in a worker).
    """
    with_paper = bool((summary["model"] == "opt-13b").all())
    charts = drawer()
    # Longest first (KV budget and memory over time take twice the others' CPU): the workers
    # finish together instead of one drawing the longest chart after the rest are done.
    if deployment is not None and max_num_seqs is not None:
        charts.draw(f"{__name__}.plot_kv_budget_of_run", summary, deployment, max_num_seqs,
                    out_dir)  # fmt: skip
    charts.draw("kvbench.plots.run_charts.plot_memory_over_time", steps, out_dir)
    charts.draw("kvbench.plots.run_charts.plot_breakdown", summary, out_dir, with_paper)
    charts.draw("kvbench.plots.headline_chart.plot_headline", summary, out_dir, with_paper)
    charts.draw("kvbench.plots.run_charts.plot_batch_sizes", summary, out_dir, with_paper)


def plot_sweeps(summary: pd.DataFrame, knees: pd.DataFrame, out_dir: Path) -> None:
    """The study's charts across its runs, where the run has them: latency vs rate with knees (a
    rate sweep), latency vs block size or recompute vs swap (several block sizes), v0 vs v1
    (several schedulers)."""
    charts = drawer()
    if not knees.empty:
        charts.draw("kvbench.plots.sweep_charts.plot_latency_vs_rate", summary, knees, out_dir)
    if summary["block_size"].nunique() > 1:
        compares_preemption = summary["preemption"].nunique() > 1
        name = "recompute_vs_swap" if compares_preemption else "latency_vs_block_size"
        charts.draw("kvbench.plots.sweep_charts.plot_latency_vs_block_size", summary, out_dir,
                    name)  # fmt: skip
    if "scheduler" in summary.columns and summary["scheduler"].nunique() > 1:
        charts.draw("kvbench.plots.scheduler_chart.plot_scheduler_comparison", summary, out_dir)


def plot_fleet(fleet: pd.DataFrame, out_dir: Path) -> None:
    """The capacity analysis's chart: the fleet each allocator needs."""
    drawer().draw("kvbench.plots.capacity_chart.plot_capacity", fleet, out_dir)
