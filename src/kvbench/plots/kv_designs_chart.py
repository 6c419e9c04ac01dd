"""The KV designs side by side (``experiment=kv_designs``, ``kv_designs_70b``): naive, paged and
virtual-contiguous (vAttention) allocators, each in the model's dtype and in fp8.

One row of panels per workload, four panels per row: token states as a share of the memory held
(not free), the mean batch and the TTFT p50 at the sweep's highest rate, and the knee over the
whole sweep. Horizontal bars, one pair per allocator: the model's KV dtype solid, fp8 hatched,
every bar labelled with its number.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import allocator_color, figure_size, save_figure

# (column of ``kv_designs_rows``, panel title, label format)
PANELS = (
    ("token_states_pct_of_held", "token states, % of held memory", "{:.0f} %"),
    ("mean_batch_size", "mean batch (seqs)", "{:.0f}"),
    ("knee_rate", "knee (req/s; +: never crossed)", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.2g}"),
)
FP8 = "fp8"
_BAR_HEIGHT = 0.38


def kv_designs_rows(summary: pd.DataFrame, knees: pd.DataFrame) -> pd.DataFrame:
    """What the chart draws: per (workload, allocator, kv_dtype), the summary at the highest rate
    of its sweep and the knee of its curve (``knee_censored``: never crossed, the knee is the
    sweep's highest rate).

    Args:
        summary: ``summary.parquet`` rows of one experiment (every rate, both KV dtypes).
        knees: ``knees_frame`` of those rows.
    Returns:
        columns workload, allocator, kv_dtype, request_rate, token_states_pct_of_held,
        mean_batch_size, ttft_p50_s, knee_rate, knee_censored; allocators in the summary's
        order, the model's dtype before fp8.
    """
    keys = ["workload", "allocator", "kv_dtype"]
    top = summary.loc[summary.groupby(keys, sort=False)["request_rate"].idxmax()]
    columns = [*keys, "request_rate", "token_states_pct_of_held", "mean_batch_size",
               "ttft_p50_s"]  # fmt: skip
    rows = top[columns].reset_index(drop=True)
    if knees.empty:
        rows["knee_rate"], rows["knee_censored"] = math.nan, False
    else:
        rows = rows.merge(knees[[*keys, "knee_rate", "knee_censored"]], on=keys, how="left")
    order = {name: index for index, name in enumerate(summary["allocator"].unique())}
    rows = rows.assign(_allocator=rows["allocator"].map(order),
                       _fp8=rows["kv_dtype"] == FP8)  # fmt: skip
    return (rows.sort_values(["workload", "_allocator", "_fp8"], kind="stable")
            .drop(columns=["_allocator", "_fp8"]).reset_index(drop=True))  # fmt: skip


def plot_kv_designs(rows: pd.DataFrame, out_dir: Path, name: str, title: str = "") -> None:
    """The designs chart of ``kv_designs_rows`` output, saved as ``out_dir/name.png``, under
    ``title`` (e.g. the experiment and its deployment)."""
    workloads = list(rows["workload"].unique())
    allocators = list(rows["allocator"].unique())
    fig, axes = plt.subplots(
        len(workloads), len(PANELS), squeeze=False, layout="constrained",
        figsize=figure_size(12, 0.42 * len(allocators) * len(workloads) + 1.6),
    )  # fmt: skip
    for row_axes, workload in zip(axes, workloads, strict=True):
        of_workload = rows[rows["workload"] == workload]
        for column, (ax, panel) in enumerate(zip(row_axes, PANELS, strict=True)):
            _panel(ax, of_workload, allocators, panel)
            if column:
                ax.set_yticks([])
            else:
                rate = of_workload["request_rate"].max()
                ax.set_ylabel(f"{workload} (batch, TTFT at {rate:g} req/s)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    dtypes = list(dict.fromkeys(rows["kv_dtype"]))
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor="#868e96", **_dtype_style(dtype))
               for dtype in dtypes]  # fmt: skip
    fig.legend(handles, [f"KV {dtype}" for dtype in dtypes], loc="outside lower center",
               ncols=len(dtypes), fontsize=8, frameon=False)  # fmt: skip
    save_figure(fig, out_dir, name)


def _dtype_style(kv_dtype: str) -> dict[str, Any]:
    """fp8 bars hatched and lighter; the model's dtype solid."""
    if kv_dtype == FP8:
        return {"hatch": "///", "alpha": 0.55, "edgecolor": "white"}
    return {}


def _panel(ax: plt.Axes, rows: pd.DataFrame, allocators: list[str],
           panel: tuple[str, str, str]) -> None:  # fmt: skip
    column, title, fmt = panel
    shown_max = 0.0
    for index, allocator in enumerate(allocators):
        pair = rows[rows["allocator"] == allocator]
        for offset, (_, row) in enumerate(pair.iterrows()):
            value = float(row[column])
            shown = 0.0 if math.isnan(value) else value
            shown_max = max(shown_max, shown)
            y = index + (offset - 0.5) * _BAR_HEIGHT
            ax.barh(y, shown, height=_BAR_HEIGHT, color=allocator_color(allocator),
                    **_dtype_style(str(row["kv_dtype"])))  # fmt: skip
            censored = column == "knee_rate" and bool(row["knee_censored"])
            text = "n/a" if math.isnan(value) else fmt.format(value) + ("+" if censored else "")
            ax.text(shown, y, f" {text}", va="center", fontsize=6)
    ax.set_yticks(range(len(allocators)), allocators, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=8)
    ax.set_xlim(0, max(shown_max, 1e-9) * 1.35)
    ax.tick_params(axis="x", labelsize=6)
