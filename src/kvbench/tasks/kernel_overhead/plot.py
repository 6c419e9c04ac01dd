"""The kernel-overhead run's chart: paged over contiguous time and the paged kernel's bandwidth vs
context length, one line per block size."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import save_figure

# Block sizes are not allocators: greys from dark to light with a marker each, since colour in
# every kvbench chart means an allocator (plots.figure.ALLOCATOR_COLORS).
_BLOCK_GREYS = ("#212529", "#495057", "#868e96", "#adb5bd")
_BLOCK_MARKERS = ("o", "s", "^", "D")


def plot_kernel_overhead(table: pd.DataFrame, out_dir: Path) -> None:
    """Overhead (%) and the paged kernel's GB/s vs context length, one line per block size."""
    fig, (overhead_ax, bandwidth_ax) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for index, (block_size, rows) in enumerate(table.groupby("block_size")):
        rows = rows.sort_values("context_len")
        style = {
            "color": _BLOCK_GREYS[index % len(_BLOCK_GREYS)],
            "marker": _BLOCK_MARKERS[index % len(_BLOCK_MARKERS)],
            "label": f"block {block_size}",
        }
        overhead_ax.plot(rows["context_len"], rows["overhead_pct"], **style)
        bandwidth_ax.plot(rows["context_len"], rows["achieved_gb_per_s"], **style)
    overhead_ax.axhline(0.0, color="black", linewidth=0.8)
    overhead_ax.set_ylabel("paged over contiguous time (%)")
    bandwidth_ax.set_ylabel("paged kernel K/V read (GB/s)")
    context_lens = sorted(table["context_len"].unique())
    for ax in (overhead_ax, bandwidth_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(context_lens, labels=[str(length) for length in context_lens])
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    handles, labels = overhead_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), frameon=False)
    first = table.iloc[0]
    fig.suptitle(f"Decode attention, paged vs contiguous: {first['device']} ({first['backend']})")
    save_figure(fig, out_dir, "kernel_overhead")
