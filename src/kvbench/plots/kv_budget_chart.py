"""The budgeting chart (``kv_budget.png``): weights vs the KV cache each allocator holds, as the
context and the batch grow, with the crossover where the KV cache outgrows the weights.

Two panels, both on log axes: left, ``num_seqs`` sequences whose context grows to the model's
maximum; right, sequences of ``context_tokens`` tokens growing in number. Lines: the weights
(flat), the KV the tokens use, the KV each allocator holds for them (``analysis.kv_budget``),
and the deployment's KV pool; a marker where each KV line crosses the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter

from kvbench.analysis.kv_budget import (
    BUDGET_ALLOCATORS,
    KvBudget,
    budget_series,
    crossover_context_tokens,
    crossover_num_seqs,
    kv_budget,
)
from kvbench.core.specs import Deployment
from kvbench.plots.figure import allocator_color, allocator_linestyle, figure_size, save_figure

USED_COLOR = "#212529"
WEIGHTS_COLOR = "#495057"
# The sequence counts of the right panel go up to this many; the x points are 2^(1/4) apart.
MAX_PLOTTED_SEQS = 4096
STEPS_PER_DOUBLING = 4


def _geometric(low: int, high: int) -> list[int]:
    """``low`` to ``high`` in steps of 2^(1/4): points between the powers of two show where a
    power-of-two reservation jumps."""
    values = sorted({round(low * 2 ** (i / STEPS_PER_DOUBLING)) for i in range(
        int(STEPS_PER_DOUBLING * math.log2(high / low)) + 1)})  # fmt: skip
    return [value for value in values if value < high] + [high]


def _crossing_text(name: str, crossing: float | None, first_x: float) -> str:
    if crossing is None:
        return f"{name} never"
    if crossing <= first_x:
        return f"{name} from the start"
    return f"{name} {crossing:,.0f}"


def _panel(ax: Axes, series: pd.DataFrame, x_key: str, budget: KvBudget,
           crossing_of: Callable[[str | None], float | None]) -> str:  # fmt: skip
    """Draw one panel, marking where each KV line reaches the weights (``crossing_of(None)``
    for the tokens' own KV, ``crossing_of(name)`` for an allocator's); returns those crossings
    as one line of text."""
    x = series[x_key]
    weights_gb = budget.weight_bytes / 1e9
    ax.axhline(weights_gb, color=WEIGHTS_COLOR, linewidth=2, label="weights")
    pool_gb = budget.kv_cache_bytes / 1e9
    ax.axhline(pool_gb, color=WEIGHTS_COLOR, linestyle=":", linewidth=1,
               label=f"this deployment's KV pool ({pool_gb:.1f} GB)")  # fmt: skip
    # Used first and wide: paged's line (used rounded up to a block) runs on top of it.
    lines: list[tuple[str | None, str, str, str, float, float]] = [
        (None, "KV used by tokens", USED_COLOR, "-", 4.0, 0.3)
    ]
    lines += [(name, f"KV held: {name}", allocator_color(name), allocator_linestyle(name), 1.3,
               1.0) for name in BUDGET_ALLOCATORS]  # fmt: skip
    crossings = []
    for name, label, color, style, width, alpha in lines:
        column = "kv_used_gb" if name is None else f"kv_held_gb_{name}"
        ax.plot(x, series[column], color=color, linestyle=style, label=label, linewidth=width,
                alpha=alpha)  # fmt: skip
        crossing = crossing_of(name)
        crossings.append(_crossing_text(name or "used", crossing, float(x.iloc[0])))
        if crossing is not None and float(x.iloc[0]) < crossing <= float(x.iloc[-1]):
            ax.plot([crossing], [weights_gb], marker="o", color=color, markersize=6,
                    markeredgecolor="white")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # Plain numbers (1,024 tokens, 100 GB) read faster than 2^10 and 10^2, and draw faster.
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.10g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(labelsize=7)
    ax.set_ylabel("GPU memory (GB)", fontsize=8)
    return "KV = weights at: " + ", ".join(crossings)


def plot_kv_budget(
    deployment: Deployment, num_seqs: int, context_tokens: int, block_size: int, out_dir: Path
) -> None:
    """``kv_budget.png`` for ``deployment``: left, ``num_seqs`` sequences of a growing context;
    right, a growing number of ``context_tokens``-token sequences (module doc)."""
    budget = kv_budget(deployment)
    # Each power of two and the token after it: where a buddy reservation doubles.
    top = budget.max_model_len.bit_length()
    doublings = [2**k + step for k in range(6, top) for step in (0, 1)]
    contexts = sorted({*_geometric(64, budget.max_model_len),
                       *(c for c in doublings if c <= budget.max_model_len)})  # fmt: skip
    by_context = budget_series(budget, contexts, [num_seqs], block_size)
    counts = _geometric(1, max(MAX_PLOTTED_SEQS, num_seqs))
    by_count = budget_series(budget, [context_tokens], counts, block_size)
    fig, axes = plt.subplots(1, 2, figsize=figure_size(11, 4.6), layout="constrained")
    crossings = _panel(axes[0], by_context, "context_tokens", budget,
                       lambda name: crossover_context_tokens(budget, name, num_seqs, block_size))
    axes[0].set_xlabel(f"context per sequence (tokens)\n{crossings}", fontsize=8)
    axes[0].set_title(f"{num_seqs} sequences, context growing", fontsize=9)
    crossings = _panel(axes[1], by_count, "num_seqs", budget,
                       lambda name: crossover_num_seqs(budget, name, context_tokens, block_size))
    axes[1].set_xlabel(f"concurrent sequences\n{crossings}", fontsize=8)
    axes[1].set_title(f"sequences of {context_tokens:,} tokens, batch growing", fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize=7, frameon=False)  # fmt: skip
    model = deployment.model
    fig.suptitle(
        f"{model.name} on {deployment.num_gpus}x {deployment.hardware.name}: "
        f"{budget.weight_bytes / 1e9:.1f} GB of weights, {budget.kv_bytes_per_token:,} B of KV "
        f"per token: the KV cache outgrows the weights at {budget.crossover_tokens:,.0f} tokens "
        f"in flight (o: crossings)",
        fontsize=9,
    )
    save_figure(fig, out_dir, "kv_budget")
