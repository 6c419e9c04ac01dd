"""What vLLM v1's scheduler changes against the paper's engine, per allocator, over a rate sweep.

One row of panels per workload: mean batch, finished requests/s, TTFT p50 and token states as a
share of the KV memory held, against the request rate. Colour: the allocator (as in every chart);
solid: ``vllm_v0`` (whole-prompt prefill), dashed: ``vllm_v1`` (chunked prefill).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import allocator_color, figure_size, save_figure

# (summary column, panel title, log scale)
PANELS = (
    ("mean_batch_size", "mean batch (seqs)", False),
    ("request_throughput", "finished req/s", False),
    ("ttft_p50_s", "TTFT p50 (s)", True),
    ("token_states_pct_of_held", "token states, % of KV held", False),
)
SCHEDULER_LINESTYLES = {"vllm_v0": "-", "vllm_v1": "--"}
MAX_WORKLOADS = 3


def scheduler_lines(summary: pd.DataFrame) -> list[tuple[str, str, str, pd.DataFrame]]:
    """(workload, allocator, scheduler, its rows sorted by rate) for every line the chart draws."""
    keys = ["workload", "allocator", "scheduler"]
    return [
        (str(workload), str(allocator), str(scheduler), rows.sort_values("request_rate"))
        for (workload, allocator, scheduler), rows in summary.groupby(keys, sort=False)
    ]


def plot_scheduler_comparison(summary: pd.DataFrame, out_dir: Path) -> None:
    """``scheduler_comparison``: every allocator under each scheduler of ``summary`` (which
    compares at least two), one row of panels per workload (the first ``MAX_WORKLOADS``)."""
    workloads = list(summary["workload"].unique())[:MAX_WORKLOADS]
    fig, axes = plt.subplots(
        len(workloads), len(PANELS), figsize=figure_size(12, 3.0 * len(workloads) + 1.2),
        squeeze=False, layout="constrained",
    )  # fmt: skip
    for workload, allocator, scheduler, rows in scheduler_lines(summary):
        if workload not in workloads:
            continue
        row_axes = axes[workloads.index(workload)]
        for ax, (column, _, _) in zip(row_axes, PANELS, strict=True):
            ax.plot(rows["request_rate"], rows[column], marker="o", markersize=3,
                    color=allocator_color(allocator),
                    linestyle=SCHEDULER_LINESTYLES.get(scheduler, ":"),
                    label=f"{allocator}, {scheduler}")  # fmt: skip
    for row_axes, workload in zip(axes, workloads, strict=True):
        for ax, (_, title, log_scale) in zip(row_axes, PANELS, strict=True):
            ax.set_title(f"{workload}: {title}", fontsize=9)
            ax.set_xlabel("request rate (req/s)", fontsize=8)
            ax.tick_params(labelsize=7)
            if log_scale:
                ax.set_yscale("log")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5),
               fontsize=7, frameon=False)  # fmt: skip
    first = summary.iloc[0]
    fig.suptitle(f"vLLM v0 (solid, whole-prompt prefill) vs v1 (dashed, chunked prefill): "
                 f"{first['model']} on {first['num_gpus']}x {first['hardware']}",
                 fontsize=10)  # fmt: skip
    save_figure(fig, out_dir, "scheduler_comparison")
