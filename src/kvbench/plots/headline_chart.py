"""The headline chart of a run (``headline.png``): what each allocator's KV memory holds, at the
rate where memory binds.

One row per workload, three panels: token states as a share of the KV memory the allocator holds
(the paper's Fig. 2 measure, with the paper's bars beside it where the run reproduces it), the GB
held vs the GB its tokens use, and the mean batch with the throughput it gave. The title says the
finding in one line: "naive_max holds 14.4 GB of KV for 1.2 GB of tokens (12x); paged 7.6 GB for
7.4 GB (1.02x), and batches 6.0x the requests".
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes

from kvbench.analysis.paper import FIG2_BREAKDOWN_PCT
from kvbench.plots.figure import allocator_color, figure_size, save_figure

# An allocator is memory-bound at a rate when less than this share of its pool is free
# (time-weighted; the rest is held), or when it preempted.
MEMORY_BOUND_FREE_PCT = 10.0
PAPER_COLOR = "#adb5bd"
POOL_COLOR = "#e9ecef"


def memory_bound(summary: pd.DataFrame) -> pd.Series:
    """Whether each row's allocator ran out of KV memory: under ``MEMORY_BOUND_FREE_PCT`` free,
    or a preemption."""
    return (summary["free_pct"] < MEMORY_BOUND_FREE_PCT) | (summary["num_preemptions"] > 0)


def headline_rate(runs: pd.DataFrame) -> float:
    """The rate of one workload's sweep where memory binds: the highest rate at which some
    allocator is memory-bound and another is not (the contrast the chart exists for); else the
    lowest rate at which one is; else (memory never binds) the highest rate."""
    bound = runs.assign(bound=memory_bound(runs)).groupby("request_rate")["bound"]
    some, every = bound.any(), bound.all()
    contrasting = some & ~every
    if contrasting.any():
        return float(contrasting[contrasting].index.max())
    if some.any():
        return float(some[some].index.min())
    return float(runs["request_rate"].max())


def headline_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Each workload's rows at its ``headline_rate``, in the run's allocator order."""
    parts = [
        runs[runs["request_rate"] == headline_rate(runs)]
        for _, runs in summary.groupby("workload", sort=False)
    ]
    return pd.concat(parts, ignore_index=True)


def finding(rows: pd.DataFrame) -> str:
    """One line: the allocator holding the most per token vs the one holding the least."""
    ratio = 100.0 / rows["token_states_pct_of_held"]
    worst, best = rows.loc[ratio.idxmax()], rows.loc[ratio.idxmin()]
    if worst["allocator"] == best["allocator"]:
        return f"{best['allocator']} holds {best['kv_held_gb']:.1f} GB"
    batch_gain = best["mean_batch_size"] / worst["mean_batch_size"]
    return (
        f"{worst['allocator']} holds {worst['kv_held_gb']:.1f} GB of KV for "
        f"{worst['token_states_gb']:.1f} GB of tokens ({ratio.loc[worst.name]:.1f}x); "
        f"{best['allocator']} {best['kv_held_gb']:.1f} GB for {best['token_states_gb']:.1f} GB "
        f"({ratio.loc[best.name]:.2f}x) and batches {batch_gain:.1f}x the requests"
    )


def _bars(ax: Axes, rows: pd.DataFrame, values: list[float]) -> None:
    names = list(rows["allocator"])
    ax.barh(range(len(names)), values, color=[allocator_color(n) for n in names], height=0.6)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=7)


def _share_panel(ax: Axes, rows: pd.DataFrame, with_paper: bool) -> None:
    shares = list(rows["token_states_pct_of_held"])
    _bars(ax, rows, shares)
    for i, (name, share) in enumerate(zip(rows["allocator"], shares, strict=True)):
        text = f" {share:.1f} %"
        paper = FIG2_BREAKDOWN_PCT.get(name, {}).get("token_states") if with_paper else None
        if paper is not None:
            ax.barh(i + 0.38, paper, height=0.22, color=PAPER_COLOR)
            text += f"  (paper {paper:.1f})"
        ax.text(share, i, text, va="center", fontsize=7)
    ax.set_xlim(0, 155)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("%", fontsize=7)
    title = "token states, % of KV held"
    ax.set_title(title + (" (grey: paper's Fig. 2)" if with_paper else ""), fontsize=9)


def _memory_panel(ax: Axes, rows: pd.DataFrame) -> None:
    held = list(rows["kv_held_gb"])
    used = list(rows["token_states_gb"])
    _bars(ax, rows, held)
    ax.barh(range(len(used)), used, color="#2b2b2b", height=0.25)
    for i, (held_value, used_value) in enumerate(zip(held, used, strict=True)):
        ax.text(held_value, i, f" {held_value:.1f} held / {used_value:.1f} used", va="center",
                fontsize=7)  # fmt: skip
    pool_gb = float(rows["kv_pool_gb"].max())
    # The pool as a shaded span behind the bars: how much of it each allocator holds.
    ax.axvspan(0, pool_gb, color=POOL_COLOR, zorder=0)
    ax.set_xlim(0, max([*held, pool_gb]) * 1.6)
    ax.set_xlabel(f"GB (shaded: the KV pool, {pool_gb:.1f} GB)", fontsize=7)
    ax.set_title("KV GB held (bar) vs used by tokens (black)", fontsize=9)
    ax.set_yticks([])


def _batch_panel(ax: Axes, rows: pd.DataFrame) -> None:
    batches = list(rows["mean_batch_size"])
    _bars(ax, rows, batches)
    for i, row in enumerate(rows.itertuples()):
        ax.text(batches[i], i, f" {row.mean_batch_size:.1f} ({row.request_throughput:.2f} req/s)",
                va="center", fontsize=7)  # fmt: skip
    ax.set_xlim(0, max([*batches, 1e-9]) * 1.9)
    ax.set_xlabel("requests batched per iteration", fontsize=7)
    ax.set_title("mean batch (throughput)", fontsize=9)
    ax.set_yticks([])


def plot_headline(summary: pd.DataFrame, out_dir: Path, with_paper: bool = False) -> None:
    """``headline.png``: per workload, at its ``headline_rate``, each allocator's share of held
    KV memory storing tokens, GB held vs used, and mean batch; the paper's Fig. 2 bars beside the
    shares on ShareGPT when ``with_paper``."""
    rows = headline_rows(summary)
    workloads = list(rows.groupby("workload", sort=False))
    height = 0.32 * len(rows) + 1.2 * len(workloads) + 0.6
    fig = plt.figure(figsize=figure_size(12, height), layout="constrained")
    subfigs = fig.subfigures(len(workloads), 1, squeeze=False)[:, 0]
    for subfig, (workload, runs) in zip(subfigs, workloads, strict=True):
        runs = runs.reset_index(drop=True)
        axes = subfig.subplots(1, 3)
        _share_panel(axes[0], runs, with_paper and str(workload).startswith("sharegpt"))
        _memory_panel(axes[1], runs)
        _batch_panel(axes[2], runs)
        rate = float(runs["request_rate"].iloc[0])
        subfig.suptitle(f"{workload} @ {rate:g} req/s: {finding(runs)}", fontsize=8)
    first = summary.iloc[0]
    fig.suptitle(
        f"What the KV memory holds: {first['model']} on {first['num_gpus']}x {first['hardware']} "
        f"({first['kv_pool_gb']:.1f} GB of KV), at the rate where memory binds",
        fontsize=10,
    )
    save_figure(fig, out_dir, "headline")
