"""Charts of a run, as small multiples (one panel per workload and rate, legends
outside the data, colours per allocator from ``figure``): Fig. 2 breakdown, memory over time,
Fig. 13 batch sizes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeVar

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from kvbench.allocators.base import USAGE_CATEGORIES
from kvbench.analysis.paper import FIG2_BREAKDOWN_PCT, FIG13_MEAN_BATCH_SIZE, FIG13_REQUEST_RATES
from kvbench.plots.figure import allocator_color, allocator_linestyle, figure_size, save_figure
from kvbench.plots.time_series import held_gb, memory_chart_rows

# Small multiples: at most this many panels per row and per figure (a sweep of more rates shows
# evenly spaced ones), and a category's share is printed on its bar segment from this width on.
MAX_COLUMNS = 3
MAX_PANELS = 12
MIN_LABELLED_PCT = 8.0
T = TypeVar("T")
# The categories in shades of grey, so that colour always means an allocator: dark = tokens,
# mid = reserved for tokens to come, hatched = wasted, near white = free.
CATEGORY_COLORS = {
    "token_states": "#212529",
    "reservation": "#868e96",
    "internal_frag": "#ced4da",
    "external_frag": "#ced4da",
    "free": "#f8f9fa",
}
CATEGORY_HATCHES = {"internal_frag": "////", "external_frag": "xxx"}
# Segments whose share is printed in white (dark fills).
DARK_CATEGORIES = ("token_states", "reservation")
CATEGORY_LABELS = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal_frag": "internal frag.",
    "external_frag": "external frag. & others",
    "free": "free",
}


def _panel_keys(summary: pd.DataFrame) -> list[str]:
    # What tells two runs of the table apart besides the allocator: the workload and rate, and
    # the deployment or experiment where an aggregated table holds several.
    varying = [key for key in ("experiment", "model", "num_gpus") if key in summary.columns
               and summary[key].nunique() > 1]  # fmt: skip
    return [*varying, "workload", "request_rate"]


def _panel_title(labels: dict[str, object]) -> str:
    rate = float(labels["request_rate"])  # type: ignore[arg-type]
    extra = [str(labels[key]) for key in ("experiment", "model") if key in labels]
    if "num_gpus" in labels:
        extra.append(f"{labels['num_gpus']} GPUs")
    prefix = ", ".join(extra)
    return f"{prefix + ': ' if prefix else ''}{labels['workload']} @ {rate:g} req/s"


def _grid(count: int, panel_width_in: float, panel_height_in: float) -> tuple[Figure, list[Axes]]:
    columns = min(count, MAX_COLUMNS)
    rows = math.ceil(count / columns)
    size = figure_size(panel_width_in * columns, panel_height_in * rows + 0.9)
    fig, axes = plt.subplots(rows, columns, figsize=size, squeeze=False, layout="constrained")
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _evenly_spaced(panels: list[T]) -> list[T]:
    """At most ``MAX_PANELS`` of ``panels``, evenly spaced, the first and the last among them."""
    if len(panels) <= MAX_PANELS:
        return panels
    step = (len(panels) - 1) / (MAX_PANELS - 1)
    return [panels[round(i * step)] for i in range(MAX_PANELS)]


def _shown(num_shown: int, total: int) -> str:
    # Said in the title when the panels are a selection.
    return "" if num_shown == total else f" ({num_shown} of {total} rates, evenly spaced)"


def _stacked_bars(ax: Axes, names: list[str], breakdowns: list[dict[str, float]]) -> None:
    """One horizontal bar per allocator, its categories stacked left to right (% of pool)."""
    lefts = [0.0] * len(names)
    for category in USAGE_CATEGORIES:
        widths = [values.get(category, 0.0) for values in breakdowns]
        ax.barh(range(len(names)), widths, left=lefts, color=CATEGORY_COLORS[category],
                hatch=CATEGORY_HATCHES.get(category), edgecolor="#495057", linewidth=0.3,
                label=CATEGORY_LABELS[category], height=0.7)  # fmt: skip
        for i, (width, left) in enumerate(zip(widths, lefts, strict=True)):
            if width >= MIN_LABELLED_PCT:
                text_color = "white" if category in DARK_CATEGORIES else "black"
                backing = (dict(facecolor="white", edgecolor="none", pad=0.5)
                           if category in CATEGORY_HATCHES else None)  # fmt: skip
                ax.text(left + width / 2, i, f"{width:.0f}", ha="center", va="center",
                        fontsize=7, color=text_color, bbox=backing)  # fmt: skip
        lefts = [left + width for left, width in zip(lefts, widths, strict=True)]
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for label, name in zip(ax.get_yticklabels(), names, strict=True):
        label.set_color(allocator_color(name.removesuffix(" (paper)")))
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.tick_params(axis="x", labelsize=7)


def plot_breakdown(summary: pd.DataFrame, out_dir: Path, with_paper: bool = False) -> None:
    """``usage_breakdown.png``: the KV pool's categories per allocator (the paper's Fig. 2), one
    panel per workload and rate (small multiples), with the paper's bars in a panel of their own
    when ``with_paper``."""
    keys = _panel_keys(summary)
    all_panels = list(summary.groupby(keys, sort=False))
    panels = _evenly_spaced(all_panels)
    paper_names = [name for name in summary["allocator"].unique() if name in FIG2_BREAKDOWN_PCT]
    count = len(panels) + (1 if with_paper and paper_names else 0)
    fig, axes = _grid(count, 3.6, 0.3 * summary["allocator"].nunique() + 1.0)
    for ax, (values, runs) in zip(axes, panels, strict=False):
        labels = dict(zip(keys, values, strict=True))
        breakdowns = [{c: getattr(row, f"{c}_pct") for c in USAGE_CATEGORIES}
                      for row in runs.itertuples()]  # fmt: skip
        _stacked_bars(ax, list(runs["allocator"]), breakdowns)
        ax.set_title(_panel_title(labels), fontsize=8)
    if count > len(panels):
        _stacked_bars(axes[-1], [f"{name} (paper)" for name in paper_names],
                      [FIG2_BREAKDOWN_PCT[name] for name in paper_names])  # fmt: skip
        axes[-1].set_title("vLLM paper, Fig. 2 (OPT-13B, ShareGPT)", fontsize=8)
    for ax in axes[-min(MAX_COLUMNS, len(axes)):]:
        ax.set_xlabel("% of KV pool (time-weighted)", fontsize=7)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center",
               ncols=len(USAGE_CATEGORIES), fontsize=7, frameon=False)  # fmt: skip
    fig.suptitle(f"KV cache usage breakdown per allocator{_shown(len(panels), len(all_panels))}",
                 fontsize=10)  # fmt: skip
    save_figure(fig, out_dir, "usage_breakdown")


def plot_memory_over_time(steps: pd.DataFrame, out_dir: Path) -> None:
    """Token states and held memory (GB, not free) over time, one panel per workload and rate.

    Each line draws its per-pixel envelope (``memory_chart_rows``): every peak of a run of
    millions of steps, at a few thousand points.
    """
    rows = memory_chart_rows(steps)
    all_groups = list(rows.groupby(["workload", "request_rate"], sort=False, dropna=False))
    groups = _evenly_spaced(all_groups)
    fig, axes = _grid(len(groups), 4.0, 2.6)
    for ax, ((workload, rate), frame) in zip(axes, groups, strict=True):
        for allocator, run in frame.groupby("allocator", sort=False):
            color, style = allocator_color(str(allocator)), allocator_linestyle(str(allocator))
            ax.plot(run["time_s"], held_gb(run), color=color, linestyle=style, linewidth=1.2,
                    label=f"{allocator}")  # fmt: skip
            ax.plot(run["time_s"], run["token_states_gb"], color=color, linestyle=":",
                    linewidth=0.9)  # fmt: skip
        ax.set_title(f"{workload} @ {rate:g} req/s", fontsize=8)
        ax.set_xlabel("time (s)", fontsize=7)
        ax.set_ylabel("KV memory (GB)", fontsize=7)
        ax.tick_params(labelsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="black", linestyle=":", linewidth=0.9))
    labels.append("tokens (dotted; held: solid/dashed)")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6),
               fontsize=7, frameon=False)  # fmt: skip
    shown = _shown(len(groups), len(all_groups))
    fig.suptitle("KV memory held by each allocator (solid/dashed) and used by tokens (dotted)"
                 + shown, fontsize=10)  # fmt: skip
    save_figure(fig, out_dir, "memory_over_time")


def plot_batch_sizes(summary: pd.DataFrame, out_dir: Path, with_paper: bool = False) -> None:
    """``batch_size.png``: mean batched requests per allocator and rate (the paper's Fig. 13),
    one panel per workload; the paper's batch sizes as hollow diamonds when ``with_paper``."""
    workloads = list(summary.groupby("workload", sort=False))
    fig, axes = _grid(len(workloads), 4.0, 2.8)
    allocators = list(summary["allocator"].unique())
    width = 0.8 / len(allocators)
    for ax, (workload, runs) in zip(axes, workloads, strict=False):
        rates = sorted(runs["request_rate"].unique())
        for j, allocator in enumerate(allocators):
            mine = runs[runs["allocator"] == allocator].set_index("request_rate")
            positions = [i + (j - (len(allocators) - 1) / 2) * width for i in range(len(rates))]
            values = [float(mine["mean_batch_size"].get(rate, float("nan"))) for rate in rates]
            ax.bar(positions, values, width=width, color=allocator_color(allocator),
                   label=allocator)  # fmt: skip
            paper = FIG13_MEAN_BATCH_SIZE.get(str(workload), {}).get(allocator)
            paper_rate = FIG13_REQUEST_RATES.get(str(workload))
            if with_paper and paper is not None and paper_rate in rates:
                ax.plot([positions[rates.index(paper_rate)]], [paper], marker="D",
                        markerfacecolor="none", linestyle="none", color="black",
                        markersize=5)  # fmt: skip
        ax.set_xticks(range(len(rates)), [f"{rate:g}" for rate in rates], fontsize=7)
        ax.set_xlabel("request rate (req/s)", fontsize=7)
        ax.set_ylabel("mean batched requests", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(str(workload), fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    if with_paper:
        handles.append(Line2D([], [], marker="D", markerfacecolor="none", linestyle="none",
                              color="black"))  # fmt: skip
        labels.append("paper (Fig. 13)")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3),
               fontsize=7, frameon=False)  # fmt: skip
    fig.suptitle("Requests batched per iteration\n(mean over the run)", fontsize=10)
    save_figure(fig, out_dir, "batch_size")
