"""The kernel-overhead run's chart: paged over contiguous time and the paged kernel's bandwidth vs
context length, one line per block size."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import save_figure


def plot_kernel_overhead(table: pd.DataFrame, out_dir: Path) -> None:
    """Overhead (%) and the paged kernel's GB/s vs context length, one line per block size."""
    fig, (overhead_ax, bandwidth_ax) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for block_size, rows in table.groupby("block_size"):
        rows = rows.sort_values("context_len")
        label = f"block {block_size}"
        overhead_ax.plot(rows["context_len"], rows["overhead_pct"], marker="o", label=label)
        bandwidth_ax.plot(rows["context_len"], rows["achieved_gb_per_s"], marker="o", label=label)
    overhead_ax.axhline(0.0, color="black", linewidth=0.8)
    overhead_ax.set_ylabel("paged over contiguous time (%)")
    bandwidth_ax.set_ylabel("paged kernel K/V read (GB/s)")
    context_lens = sorted(table["context_len"].unique())
    for ax in (overhead_ax, bandwidth_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(context_lens, labels=[str(length) for length in context_lens])
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    first = table.iloc[0]
    fig.suptitle(f"Decode attention, paged vs contiguous: {first['device']} ({first['backend']})")
    save_figure(fig, out_dir, "kernel_overhead")
