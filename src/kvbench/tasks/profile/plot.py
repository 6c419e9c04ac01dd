"""The profile's chart: fitted vs measured seconds of every timed point (log-log)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import save_figure

_MARKERS = {"iteration": "o", "swap": "s"}


def plot_predicted_vs_measured(
    table: pd.DataFrame, out_dir: Path, name: str, title: str, group: str = "kind"
) -> None:
    """``predicted_s`` against ``measured_s``, one marker per ``group`` value, with the diagonal
    (a perfect model) and +-10 % lines; PNG and SVG under ``name``."""
    fig, ax = plt.subplots(figsize=(6, 6), layout="constrained")
    for value, rows in table.groupby(group):
        ax.scatter(rows["measured_s"], rows["predicted_s"], s=14, alpha=0.8,
                   marker=_MARKERS.get(str(value), "o"), label=str(value))  # fmt: skip
    low = float(min(table["measured_s"].min(), table["predicted_s"].min()))
    high = float(max(table["measured_s"].max(), table["predicted_s"].max()))
    span = [low * 0.8, high * 1.25]
    ax.plot(span, span, color="black", linewidth=0.8, label="predicted = measured")
    for factor in (0.9, 1.1):
        ax.plot(span, [v * factor for v in span], color="grey", linewidth=0.6, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (s)")
    ax.set_ylabel("predicted (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, frameon=False)
    save_figure(fig, out_dir, name)
