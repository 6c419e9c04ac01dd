"""Charts of prefix caching by design and tier: radix vs block-hash caches at their page sizes,
and hit rate, TTFT and throughput vs the size of a CPU offload tier (``experiment=radix_offload``).

Drawn from summary rows (one per allocator x workload x page size x tier size); ``docs/charts.md``
says how to read them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvbench.plots.figure import OTHER_COLOR, allocator_color, figure_size, save_figure

# A cache design: (allocator, its block or page size in tokens).
Design = tuple[str, int]
CPU_TIER_HATCH = "//"


def _designs(rows: pd.DataFrame) -> list[Design]:
    pairs = rows[["allocator", "block_size"]].drop_duplicates().itertuples(index=False)
    return sorted((str(name), int(size)) for name, size in pairs)


def _hatch(design: Design, designs: list[Design]) -> str | None:
    """Designs of one allocator share its colour: the second and later get a hatch."""
    same_allocator = [other for other in designs if other[0] == design[0]]
    return (None, "..", "xx", "++")[min(same_allocator.index(design), 3)]


def _label(design: Design) -> str:
    name, size = design
    return f"{name} ({'page' if name == 'radix' else 'block'} {size})"


def page_size_chart(summary: pd.DataFrame, out_dir: Path) -> bool:
    """Hit rate per workload of each cache design without a CPU tier, beside the unbounded
    ideal at the same block size (``plots/prefix_designs``); False when nothing to draw."""
    rows = summary[(summary["cpu_cache_gib"] == 0) & summary["ideal_prefix_hit_rate"].notna()]
    if rows.empty:
        return False
    workloads = sorted(rows["workload"].unique())
    designs = _designs(rows)
    fig, axes = plt.subplots(1, len(workloads), squeeze=False,
                             figsize=figure_size(4.5 * len(workloads), 4.0))  # fmt: skip
    width = 0.8 / len(designs)
    for ax, workload in zip(axes[0], workloads, strict=True):
        at_workload = rows[rows["workload"] == workload]
        for index, design in enumerate(designs):
            name, size = design
            row = at_workload[(at_workload["allocator"] == name)
                              & (at_workload["block_size"] == size)]  # fmt: skip
            if row.empty:
                continue
            x = index * width
            measured = 100 * float(row["prefix_hit_rate"].iloc[0])
            ideal = 100 * float(row["ideal_prefix_hit_rate"].iloc[0])
            ax.bar(x, measured, width * 0.9, color=allocator_color(name), label=_label(design),
                   hatch=_hatch(design, designs), edgecolor="white")  # fmt: skip
            ax.plot([x - width * 0.45, x + width * 0.45], [ideal, ideal], color=OTHER_COLOR,
                    linestyle="--", label="unbounded ideal" if index == 0 else None)  # fmt: skip
            ax.text(x, measured, f"{measured:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_title(workload)
        ax.set_xticks([])
        ax.set_ylabel("prompt tokens found cached (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, out_dir, "prefix_designs")
    return True


def cpu_tier_chart(summary: pd.DataFrame, out_dir: Path, workload: str) -> bool:
    """Hit rate by tier (GPU solid, CPU hatched), TTFT p50 and throughput vs the CPU tier's
    size for each cache design on ``workload`` (``plots/cpu_tier``); False when the summary has
    fewer than two tier sizes there."""
    rows = summary[summary["workload"] == workload]
    tier_sizes = sorted(rows["cpu_cache_gib"].unique())
    if len(tier_sizes) < 2:
        return False
    designs = _designs(rows)
    fig, (hits_ax, ttft_ax, rate_ax) = plt.subplots(1, 3, figsize=figure_size(13.0, 4.2))
    positions = np.arange(len(tier_sizes))
    width = 0.8 / len(designs)
    for index, design in enumerate(designs):
        name, size = design
        color = allocator_color(name)
        by_tier = rows[(rows["allocator"] == name) & (rows["block_size"] == size)]
        by_tier = by_tier.set_index("cpu_cache_gib").reindex(tier_sizes)
        x = positions + (index - (len(designs) - 1) / 2) * width
        gpu = 100 * by_tier["prefix_gpu_hit_rate"].to_numpy(dtype=float)
        cpu = 100 * by_tier["prefix_cpu_hit_rate"].to_numpy(dtype=float)
        hits_ax.bar(x, gpu, width * 0.9, color=color, label=_label(design),
                    hatch=_hatch(design, designs), edgecolor="white")  # fmt: skip
        hits_ax.bar(x, cpu, width * 0.9, bottom=gpu, color=color, alpha=0.45,
                    hatch=CPU_TIER_HATCH, edgecolor="white")  # fmt: skip
        linestyle = "--" if index % 2 else "-"
        ttft_ax.plot(positions, by_tier["ttft_p50_s"], marker="o", color=color,
                     linestyle=linestyle, label=_label(design))  # fmt: skip
        rate_ax.plot(positions, by_tier["request_throughput"], marker="o", color=color,
                     linestyle=linestyle, label=_label(design))  # fmt: skip
    ideal = 100 * float(rows["ideal_prefix_hit_rate"].max())
    hits_ax.axhline(ideal, color=OTHER_COLOR, linestyle="--", label="unbounded ideal")
    hits_ax.set_ylabel("prompt tokens found cached (%): GPU solid, CPU hatched")
    ttft_ax.set_ylabel("TTFT p50 (s)")
    rate_ax.set_ylabel("throughput (req/s)")
    for ax in (hits_ax, ttft_ax, rate_ax):
        ax.set_xticks(positions, [f"{size:g}" for size in tier_sizes])
        ax.set_xlabel("CPU tier (GiB)")
    fig.suptitle(f"{workload}: a CPU offload tier under the GPU prefix cache")
    handles, labels = hits_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(fig, out_dir, "cpu_tier")
    return True
