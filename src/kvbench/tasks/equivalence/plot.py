"""The equivalence run's chart: the worst relative logit difference at each decode step."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.plots.figure import allocator_color, save_figure
from kvbench.tasks.equivalence.names import FP32_REL_TOLERANCE

# A log axis cannot show 0 (a bit-identical step): such steps are drawn at this floor.
ZERO_FLOOR = 1e-12
_DASHES = ("-", "--", ":", "-.")


def plot_equivalence(table: pd.DataFrame, out_dir: Path) -> None:
    """``max_rel_diff`` per step (the max over prompts and samples), one line per
    (allocator, backend), log scale, with the fp32 tolerance."""
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for index, ((allocator, backend), rows) in enumerate(
        table.groupby(["allocator", "backend"])
    ):
        worst = rows.groupby("step")["max_rel_diff"].max().clip(lower=ZERO_FLOOR)
        # Lines often coincide (bit-identical backends at the floor): dashes keep each visible.
        ax.plot(worst.index, worst.values, marker=".", linestyle=_DASHES[index % len(_DASHES)],
                color=allocator_color(str(allocator)),
                label=f"{allocator} / {backend}")  # fmt: skip
    ax.axhline(FP32_REL_TOLERANCE, color="black", linestyle="--", linewidth=0.8,
               label=f"tolerance {FP32_REL_TOLERANCE:g}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("decode step (0: prompt)")
    ax.set_ylabel(f"max |paged - stock| / max |stock| (0 drawn at {ZERO_FLOOR:g})")
    ax.set_title(f"Logits, paged vs contiguous cache: {table['model'].iloc[0]}")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    save_figure(fig, out_dir, "equivalence")
