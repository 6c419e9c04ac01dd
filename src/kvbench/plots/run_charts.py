"""Charts of a run (PNG and SVG): Fig. 2 breakdown, memory over time, Fig. 13 batch sizes."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.allocators.base import USAGE_CATEGORIES
from kvbench.analysis.paper import FIG2_BREAKDOWN_PCT, FIG13_MEAN_BATCH_SIZE
from kvbench.plots.figure import save_figure
from kvbench.plots.time_series import held_gb, memory_chart_rows

# The memory-over-time chart: its width, each panel's height, and the room (inches) around the
# panels for tick labels, axis labels and titles.
FIGURE_WIDTH_IN = 8.0
PANEL_HEIGHT_IN = 3.0
PANEL_MARGINS_IN = {"left": 0.75, "right": 0.1, "top": 0.3, "bottom": 0.5, "gap": 0.8}
CATEGORY_COLORS = {
    "token_states": "#2b8a3e",
    "reservation": "#f59f00",
    "internal_frag": "#e03131",
    "external_frag": "#862e9c",
    "free": "#ced4da",
}
CATEGORY_LABELS = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal_frag": "internal frag.",
    "external_frag": "external frag. & others",
    "free": "free",
}


def _breakdown_bars(summary: pd.DataFrame, with_paper: bool) -> list[tuple[str, dict[str, float]]]:
    bars = []
    for row in summary.itertuples():
        label = f"{row.allocator}\n{row.workload} @ {row.request_rate:g}/s"
        bars.append((label, {c: getattr(row, f"{c}_pct") for c in USAGE_CATEGORIES}))
        if with_paper and row.allocator in FIG2_BREAKDOWN_PCT:
            bars.append((f"{row.allocator}\n(paper)", FIG2_BREAKDOWN_PCT[row.allocator]))
    return bars


def plot_breakdown(summary: pd.DataFrame, out_dir: Path, with_paper: bool = False) -> None:
    """Stacked bars of the KV pool's categories per run (the paper's Fig. 2)."""
    bars = _breakdown_bars(summary, with_paper)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(bars)), 4.5))
    bottoms = [0.0] * len(bars)
    for category in USAGE_CATEGORIES:
        heights = [values.get(category, 0.0) for _, values in bars]
        ax.bar(range(len(bars)), heights, bottom=bottoms, color=CATEGORY_COLORS[category],
               label=CATEGORY_LABELS[category])  # fmt: skip
        for i, (height, bottom) in enumerate(zip(heights, bottoms, strict=True)):
            if height >= 6:
                text_color = "black" if category == "free" else "white"
                ax.text(i, bottom + height / 2, f"{height:.1f}", ha="center", va="center",
                        fontsize=7, color=text_color)  # fmt: skip
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=7)
    ax.set_ylabel("% of KV cache (time-weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("KV cache usage breakdown")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    save_figure(fig, out_dir, "usage_breakdown")


def _stacked_panel_margins(num_panels: int) -> dict[str, float]:
    """Fixed margins (``PANEL_MARGINS_IN``) of ``num_panels`` panels stacked in a column, as
    subplot parameters: a layout engine would measure every tick label again to find them."""
    margins = PANEL_MARGINS_IN
    height_in = PANEL_HEIGHT_IN * num_panels
    axes_height_in = (
        height_in - margins["top"] - margins["bottom"] - margins["gap"] * (num_panels - 1)
    ) / num_panels
    return {
        "left": margins["left"] / FIGURE_WIDTH_IN,
        "right": 1 - margins["right"] / FIGURE_WIDTH_IN,
        "top": 1 - margins["top"] / height_in,
        "bottom": margins["bottom"] / height_in,
        "hspace": margins["gap"] / axes_height_in,
    }


def plot_memory_over_time(steps: pd.DataFrame, out_dir: Path) -> None:
    """Token states and held memory (GB) over time, one panel per workload and rate.

    Each line draws its per-pixel envelope (``memory_chart_rows``): every peak of a run of
    millions of steps, at a few thousand points.
    """
    rows = memory_chart_rows(steps)
    groups = list(rows.groupby(["workload", "request_rate"], sort=False, dropna=False))
    fig, axes = plt.subplots(
        len(groups), 1, figsize=(FIGURE_WIDTH_IN, PANEL_HEIGHT_IN * len(groups)), squeeze=False,
        gridspec_kw=_stacked_panel_margins(len(groups)),
    )  # fmt: skip
    for ax, ((workload, rate), frame) in zip(axes[:, 0], groups, strict=True):
        for allocator, run in frame.groupby("allocator", sort=False):
            line = ax.plot(run["time_s"], run["token_states_gb"], label=f"{allocator} tokens")
            ax.plot(run["time_s"], held_gb(run), linestyle=":", color=line[0].get_color(),
                    label=f"{allocator} held")  # fmt: skip
        ax.set_title(f"{workload} @ {rate:g} req/s")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV memory (GB)")
        ax.legend(fontsize=6, ncols=2)
    save_figure(fig, out_dir, "memory_over_time")


def plot_batch_sizes(summary: pd.DataFrame, out_dir: Path, with_paper: bool = False) -> None:
    """Mean batched requests per run (the paper's Fig. 13), with the paper's bars beside."""
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(summary)), 4))
    labels, values, colors = [], [], []
    for row in summary.itertuples():
        labels.append(f"{row.allocator}\n{row.workload} @ {row.request_rate:g}/s")
        values.append(row.mean_batch_size)
        colors.append("#1c7ed6")
        paper = FIG13_MEAN_BATCH_SIZE.get(row.workload, {}).get(row.allocator)
        if with_paper and paper is not None:
            labels.append(f"{row.allocator}\n(paper)")
            values.append(paper)
            colors.append("#adb5bd")
    ax.bar(range(len(values)), values, color=colors)
    for i, value in enumerate(values):
        ax.text(i, value, f"{value:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("mean batched requests")
    ax.set_title("Batch size (kvbench blue, paper grey)" if with_paper else "Batch size")
    save_figure(fig, out_dir, "batch_size")
