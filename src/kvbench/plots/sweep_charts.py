"""Charts of sweeps: latency vs rate with knees (Fig. 12), vs block size (Fig. 18b),
recompute vs swap (Fig. 19).

Each takes a summary table (one run's or many aggregated) and draws one panel per curve group.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvbench.analysis.curves import LATENCY, curve_keys
from kvbench.analysis.paper import FIG12_KNEES_APPROX
from kvbench.plots.figure import allocator_color, allocator_linestyle, figure_size, save_figure

RATE_MARKERS = ("o", "s", "^", "D", "v")


def _panel_title(labels: dict) -> str:
    gpus = f"{labels.get('num_gpus', 1)}x {labels.get('hardware', '')}"
    title = f"{labels.get('workload')}: {labels.get('model')} on {gpus}"
    if "scheduler" in labels:
        title += f", {labels['scheduler']}"
    return title + (f", KV {labels['kv_dtype']}" if pd.notna(labels.get("kv_dtype")) else "")


def _panels(frame: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """One panel per curve group (``CURVE_KEYS``): the rows one knee bound holds."""
    keys = curve_keys(frame)
    return [
        (dict(zip(keys, values, strict=True)), group)
        for values, group in frame.groupby(keys, sort=False, dropna=False)
    ]


def _grid(count: int, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    columns = min(count, 2 if count <= 4 else 3)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=figure_size(width * columns, height * rows + 0.6), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def plot_latency_vs_rate(
    summary: pd.DataFrame, knees: pd.DataFrame, out_dir: Path, name: str = "latency_vs_rate"
) -> None:
    """Normalized latency vs request rate per allocator (Fig. 12): the bound dashed, knees marked,
    the paper's approximate knees as hollow diamonds on OPT-13B panels."""
    panels = _panels(summary)
    fig, axes = _grid(len(panels))
    for ax, (labels, group) in zip(axes, panels, strict=False):
        panel_knees = knees
        for key, value in labels.items():
            if key in knees.columns:
                column = panel_knees[key]
                same = column.isna() if pd.isna(value) else column == value
                panel_knees = panel_knees[same]
        for allocator, curve in group.groupby("allocator", sort=False):
            curve = curve.sort_values("request_rate")
            color = allocator_color(str(allocator))
            ax.plot(curve["request_rate"], curve[LATENCY], marker="o", markersize=3,
                    color=color, linestyle=allocator_linestyle(str(allocator)),
                    label=allocator)  # fmt: skip
            _mark_knee(ax, panel_knees, allocator, color)
        title = _panel_title(labels)
        if len(panel_knees):
            bound = float(panel_knees["latency_bound_s_per_token"].iloc[0])
            # One legend entry for every panel's bound; its value goes in the panel's title.
            ax.axhline(bound, color="grey", linestyle="--", linewidth=1,
                       label="latency bound (the knee's)")  # fmt: skip
            title += f"\nbound {bound:.3f} s/token"
            if labels.get("model") == "opt-13b":
                _mark_paper_knees(ax, labels.get("workload"), bound)
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)", fontsize=8)
        ax.set_title(title, fontsize=9)
    _figure_legend(fig, axes)
    fig.suptitle("Latency vs rate; | = knee (kvbench), ◇ = paper's knee (Fig. 12, approx.)",
                 fontsize=9)  # fmt: skip
    save_figure(fig, out_dir, name)


def _figure_legend(fig: Figure, axes: list[Axes]) -> None:
    """One legend for every panel, below them (never over the data): each label once."""
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="outside lower center",
               ncols=min(len(entries), 4), fontsize=7, frameon=False)  # fmt: skip


def _mark_knee(ax: plt.Axes, knees: pd.DataFrame, allocator: str, color: str) -> None:
    row = knees[knees["allocator"] == allocator]
    if row.empty or math.isnan(float(row["knee_rate"].iloc[0])):
        return
    rate = float(row["knee_rate"].iloc[0])
    ax.axvline(rate, color=color, linewidth=0.8, alpha=0.6, label="_knee",
               linestyle=":" if bool(row["knee_censored"].iloc[0]) else "-")  # fmt: skip


def _mark_paper_knees(ax: plt.Axes, workload: object, bound: float) -> None:
    for allocator, rate in FIG12_KNEES_APPROX.get(str(workload), {}).items():
        ax.plot([rate], [bound], marker="D", markerfacecolor="none", linestyle="none",
                color=allocator_color(allocator))  # fmt: skip


def plot_latency_vs_block_size(summary: pd.DataFrame, out_dir: Path, name: str) -> None:
    """Normalized latency vs block size (Fig. 18b; Fig. 19 when ``preemption`` varies).

    One line per (allocator, preemption, rate); the contiguous allocators ignore the block size
    and are left out.
    """
    paged = summary[summary["allocator"].str.startswith("paged")]
    keys = [key for key in ("experiment", "workload", "model", "hardware", "num_gpus")
            if key in paged.columns]  # fmt: skip
    groups = list(paged.groupby(keys, sort=False))
    fig, axes = _grid(len(groups))
    for ax, (values, group) in zip(axes, groups, strict=False):
        labels = dict(zip(keys, values, strict=True))
        line_keys = ["allocator", "preemption", "request_rate"]
        rates = sorted(group["request_rate"].unique())
        for line_values, line in group.groupby(line_keys, sort=False):
            allocator, preemption, rate = line_values
            line = line.sort_values("block_size")
            # Colour: the allocator; line style: the preemption mode; marker: the rate.
            ax.plot(line["block_size"], line[LATENCY], markersize=4,
                    marker=RATE_MARKERS[rates.index(rate) % len(RATE_MARKERS)],
                    color=allocator_color(str(allocator)),
                    linestyle="--" if preemption == "swap" else "-",
                    label=f"{allocator}, {preemption} @ {rate:g}/s")  # fmt: skip
        ax.set_xscale("log", base=2)
        sizes = sorted(group["block_size"].unique())
        ax.set_xticks(sizes, [str(size) for size in sizes])
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel("normalized latency (s/token)", fontsize=8)
        ax.set_title(_panel_title(labels), fontsize=9)
    _figure_legend(fig, axes[: len(groups)])
    save_figure(fig, out_dir, name)
