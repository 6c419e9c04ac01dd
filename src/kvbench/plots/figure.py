"""What every chart of kvbench shares: the non-interactive backend, one colour per allocator,
and how a figure is saved (PNG and SVG side by side)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# One colour per allocator in every chart of the project.
ALLOCATOR_COLORS = {
    "naive_max": "#e03131",
    "naive_pow2": "#f59f00",
    "naive_oracle": "#862e9c",
    "paged": "#1c7ed6",
    "paged_prefix": "#2b8a3e",
}
OTHER_COLOR = "#868e96"


def save_figure(fig: Figure, out_dir: Path, name: str) -> None:
    """Write ``out_dir/name.png`` and ``.svg`` (creating the folder) and close the figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for suffix in ("png", "svg"):
        fig.savefig(out_dir / f"{name}.{suffix}", dpi=120, bbox_inches="tight")
    plt.close(fig)
