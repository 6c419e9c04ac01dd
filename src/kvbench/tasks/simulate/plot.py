"""The charts a simulate run draws: each setting's (Fig. 2 breakdown, memory over time, Fig. 13
batch sizes) and the study's analyses (Fig. 12 knees, Fig. 18b/19 block sizes, capacity).

The chart modules (and matplotlib, a third of a second to import) are imported when a chart is
drawn, so that a run with ``plots=false`` never loads them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import pandas as pd


@contextlib.contextmanager
def _collector_skips_what_exists() -> Iterator[None]:
    """Drawing allocates many small objects, each batch of which wakes the cyclic garbage
    collector; everything alive before the charts (the run's records and tables, the imported
    modules) is set aside for the duration so that it does not traverse them all again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def plot_run(summary: pd.DataFrame, steps: pd.DataFrame, out_dir: Path) -> None:
    """Every chart of one run; the paper's bars appear for OPT-13B runs (its Fig. 2/13 setup)."""
    from kvbench.plots.run_charts import plot_batch_sizes, plot_breakdown, plot_memory_over_time

    with_paper = bool((summary["model"] == "opt-13b").all())
    with _collector_skips_what_exists():
        plot_breakdown(summary, out_dir, with_paper)
        plot_memory_over_time(steps, out_dir)
        plot_batch_sizes(summary, out_dir, with_paper)


def plot_analyses(
    summary: pd.DataFrame, knees: pd.DataFrame, fleet: pd.DataFrame | None, out_dir: Path
) -> None:
    """The study's charts, where the run has them: latency vs rate with knees (a rate sweep),
    latency vs block size or recompute vs swap (several block sizes), the fleet (capacity)."""
    from kvbench.plots.capacity_chart import plot_capacity
    from kvbench.plots.sweep_charts import plot_latency_vs_block_size, plot_latency_vs_rate

    if not knees.empty:
        plot_latency_vs_rate(summary, knees, out_dir)
    if summary["block_size"].nunique() > 1:
        compares_preemption = summary["preemption"].nunique() > 1
        name = "recompute_vs_swap" if compares_preemption else "latency_vs_block_size"
        plot_latency_vs_block_size(summary, out_dir, name)
    if fleet is not None:
        plot_capacity(fleet, out_dir)
