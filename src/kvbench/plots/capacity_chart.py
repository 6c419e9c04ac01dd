"""The capacity and cost chart: GPUs, dollars per hour and KV memory held vs used per allocator.

Horizontal bars, one row per allocator, every bar labelled with its number: readable at a glance.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import ALLOCATOR_COLORS, OTHER_COLOR, figure_size, save_figure


def _row_names(fleet: pd.DataFrame) -> list[str]:
    """A bar's name: its allocator, and its scheduler where the fleet compares several."""
    if "scheduler" not in fleet.columns or fleet["scheduler"].nunique() < 2:
        return list(fleet["allocator"])
    return [f"{allocator} ({scheduler})"
            for allocator, scheduler in zip(fleet["allocator"], fleet["scheduler"], strict=True)]


def _bar_panel(ax: plt.Axes, fleet: pd.DataFrame, values: list[float], fmt: str,
               title: str) -> None:  # fmt: skip
    names = _row_names(fleet)
    colors = [ALLOCATOR_COLORS.get(name, OTHER_COLOR) for name in fleet["allocator"]]
    shown = [0.0 if math.isnan(value) else value for value in values]
    ax.barh(range(len(names)), shown, color=colors)
    for i, value in enumerate(values):
        text = "cannot meet bound" if math.isnan(value) else fmt.format(value)
        ax.text(shown[i], i, f" {text}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, max([*shown, 1e-9]) * 1.45)
    ax.tick_params(axis="x", labelsize=7)


def _memory_panel(ax: plt.Axes, fleet: pd.DataFrame) -> None:
    names = _row_names(fleet)
    held = list(fleet["kv_held_gb"])
    used = list(fleet["kv_used_gb"])
    ax.barh(range(len(names)), held, color="#ced4da", label="held (not free)")
    ax.barh(range(len(names)), used, color="#2b8a3e", label="used by tokens")
    for i, (held_gb, used_gb) in enumerate(zip(held, used, strict=True)):
        if not math.isnan(held_gb):
            ax.text(held_gb, i, f" {held_gb:,.0f} held / {used_gb:,.0f} used", va="center",
                    fontsize=8)  # fmt: skip
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_title("KV memory of the fleet (GB, time-weighted)", fontsize=9)
    ax.set_xlim(0, max([*(h for h in held if not math.isnan(h)), 1e-9]) * 1.8)
    ax.legend(fontsize=7, loc="lower right")
    ax.tick_params(axis="x", labelsize=7)


def plot_capacity(fleet: pd.DataFrame, out_dir: Path) -> None:
    """GPUs, $/hour and KV held vs used per allocator (and scheduler, where ``fleet`` compares
    several) for one deployment and target rate."""
    first = fleet.iloc[0]
    fig, axes = plt.subplots(1, 3, figsize=figure_size(12, 0.55 * len(fleet) + 1.6),
                             layout="constrained")  # fmt: skip
    _bar_panel(axes[0], fleet, list(fleet["gpus"]), "{:,.0f} GPUs", "GPUs needed")
    _bar_panel(axes[1], fleet, list(fleet["cost_per_hour"]), "${:,.0f}/h",
               f"cost at ${first['price_per_gpu_hour']:.2f} per GPU-hour")  # fmt: skip
    axes[1].set_yticks([])
    _memory_panel(axes[2], fleet)
    axes[2].set_yticks([])
    fig.suptitle(
        f"Serving {first['target_request_rate']:g} req/s of {first['workload']} with "
        f"{first['model']} on {first['num_gpus']}x {first['hardware']} replicas, "
        f"normalized latency ≤ {first['latency_bound_s_per_token']:.3f} s/token",
        fontsize=10,
    )
    save_figure(fig, out_dir, "capacity_cost")
