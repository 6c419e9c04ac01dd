"""``experiment=paper_executed``'s chart: paged's throughput over the baselines, measured on a
real model beside the simulations and the paper's range, and the KV memory in use by each
allocator's requests.

Drawn from ``paper_executed.parquet`` (docs/paper_executed.md); the highest request rate's rows.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from kvbench.analysis.paper import FIG12_SHAREGPT_KNEE_RATIO_RANGE
from kvbench.plots.figure import allocator_color, figure_size, save_figure

CHART_NAME = "paper_executed"
# One hatch per source: the allocator keeps its colour, the source its texture.
SOURCE_HATCHES = {"measured": "", "profiled": "//", "roofline": ".."}
BASELINES = ("naive_max", "naive_oracle")


def paper_executed_chart(table: pd.DataFrame, out_dir: Path) -> None:
    """Left: paged / baseline output throughput per source, the paper's ShareGPT range shaded.
    Right: KV in use by requests (bar) and storing tokens (black tick) per allocator and source,
    GB."""
    rows = table[table["request_rate"] == table["request_rate"].max()]
    sources = [source for source in SOURCE_HATCHES if source in set(rows["source"])]
    fig, (ratio_ax, memory_ax) = plt.subplots(1, 2, figsize=figure_size(11, 4.5),
                                              layout="constrained")  # fmt: skip
    _draw_ratios(ratio_ax, rows, sources)
    _draw_memory(memory_ax, rows, sources)
    fig.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch=SOURCE_HATCHES[s],
                              label=s) for s in sources],
               loc="outside lower center", ncol=len(sources), frameon=False)  # fmt: skip
    rate = float(rows["request_rate"].iloc[0])
    fig.suptitle(f"The paper executed: {rows['workload'].iloc[0]} at {rate:g} req/s, "
                 "measured on the real model vs simulated", fontsize=10)  # fmt: skip
    save_figure(fig, out_dir, CHART_NAME)


def _draw_ratios(ax: plt.Axes, rows: pd.DataFrame, sources: list[str]) -> None:
    width = 0.8 / max(len(sources), 1)
    by_source = rows.drop_duplicates("source").set_index("source")
    for position, baseline in enumerate(BASELINES):
        low, high = FIG12_SHAREGPT_KNEE_RATIO_RANGE[baseline]
        ax.fill_between([position - 0.45, position + 0.45], low, high, color="#dee2e6",
                        label="paper (ShareGPT)" if position == 0 else None)  # fmt: skip
        for index, source in enumerate(sources):
            value = float(by_source.loc[source, f"paged_over_{baseline}"])
            x = position - 0.4 + width * (index + 0.5)
            ax.bar(x, value, width * 0.9, color=allocator_color("paged"), edgecolor="black",
                   hatch=SOURCE_HATCHES[source])  # fmt: skip
            ax.annotate(f"{value:.2f}x", (x, value), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(BASELINES)), [f"paged / {b}" for b in BASELINES])
    ax.set_ylabel("output tokens/s ratio")
    ax.set_title("paged's throughput over the baselines", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    ax.margins(y=0.15)


def _draw_memory(ax: plt.Axes, rows: pd.DataFrame, sources: list[str]) -> None:
    allocators = list(dict.fromkeys(rows["allocator"]))
    width = 0.8 / max(len(sources), 1)
    indexed = rows.set_index(["source", "allocator"])
    for position, allocator in enumerate(allocators):
        for index, source in enumerate(sources):
            if (source, allocator) not in indexed.index:
                continue
            row = indexed.loc[(source, allocator)]
            x = position - 0.4 + width * (index + 0.5)
            ax.bar(x, row["kv_in_use_gb"], width * 0.9, color=allocator_color(allocator),
                   edgecolor="black", hatch=SOURCE_HATCHES[source])  # fmt: skip
            ax.hlines(row["kv_used_gb"], x - width * 0.45, x + width * 0.45, color="black",
                      linewidth=2)  # fmt: skip
    ax.set_xticks(range(len(allocators)), allocators)
    ax.set_ylabel("KV memory, GB (time-weighted mean)")
    ax.set_title("KV in use (bar) and storing tokens (tick)", fontsize=10)
    ax.margins(y=0.1)
