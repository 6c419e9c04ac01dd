"""The charts a simulate run draws: each setting's (the headline, Fig. 2 breakdown, memory over
time, Fig. 13 batch sizes, the KV budget) and the study's analyses (Fig. 12 knees, Fig. 18b/19
block sizes, capacity).

The chart modules (and matplotlib, a third of a second to import) are imported when a chart is
drawn, so that a run with ``plots=false`` never loads them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from kvbench.core.specs import Deployment


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


def mean_context_tokens(summary: pd.DataFrame, deployment: Deployment) -> int:
    """Tokens per running sequence, on time average, of the allocator that batched the most at
    the headline rate: ``token_states_gb x 10^9 / kv_bytes_per_token / mean_batch_size``."""
    from kvbench.plots.headline_chart import headline_rows

    rows = headline_rows(summary)
    best = rows.loc[rows["mean_batch_size"].idxmax()]
    tokens = best["token_states_gb"] * 1e9 / deployment.kv_bytes_per_token
    return max(1, round(tokens / max(best["mean_batch_size"], 1e-9)))


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
    number.
    """
    from kvbench.plots.headline_chart import plot_headline
    from kvbench.plots.kv_budget_chart import plot_kv_budget
    from kvbench.plots.run_charts import plot_batch_sizes, plot_breakdown, plot_memory_over_time

    with_paper = bool((summary["model"] == "opt-13b").all())
    with _collector_skips_what_exists():
        plot_headline(summary, out_dir, with_paper)
        plot_breakdown(summary, out_dir, with_paper)
        plot_memory_over_time(steps, out_dir)
        plot_batch_sizes(summary, out_dir, with_paper)
        if deployment is not None and max_num_seqs is not None:
            block_size = int(summary["block_size"].iloc[0])
            context_tokens = mean_context_tokens(summary, deployment)
            plot_kv_budget(deployment, max_num_seqs, context_tokens, block_size, out_dir)


def plot_analyses(
    summary: pd.DataFrame, knees: pd.DataFrame, fleet: pd.DataFrame | None, out_dir: Path
) -> None:
    """The study's charts, where the run has them: latency vs rate with knees (a rate sweep),
    latency vs block size or recompute vs swap (several block sizes), the fleet (capacity), v0
    vs v1 (several schedulers)."""
    from kvbench.plots.capacity_chart import plot_capacity
    from kvbench.plots.scheduler_chart import plot_scheduler_comparison
    from kvbench.plots.sweep_charts import plot_latency_vs_block_size, plot_latency_vs_rate

    if not knees.empty:
        plot_latency_vs_rate(summary, knees, out_dir)
    if summary["block_size"].nunique() > 1:
        compares_preemption = summary["preemption"].nunique() > 1
        name = "recompute_vs_swap" if compares_preemption else "latency_vs_block_size"
        plot_latency_vs_block_size(summary, out_dir, name)
    if fleet is not None:
        plot_capacity(fleet, out_dir)
    if "scheduler" in summary.columns and summary["scheduler"].nunique() > 1:
        plot_scheduler_comparison(summary, out_dir)
