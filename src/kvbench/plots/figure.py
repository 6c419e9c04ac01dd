"""What every chart of kvbench shares: the non-interactive backend, one colour per allocator,
and how a figure is saved (PNG and SVG side by side)."""

from __future__ import annotations

import os
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
    """Write ``out_dir/name.png`` and ``.svg`` (creating the folder) and close the figure.

    Each file is drawn beside its place (``.NAME.tmp-PID``, as ``kvbench.tables.atomic`` names
    it) and renamed into it: a killed run leaves no half-drawn chart, a failed write (a full disk)
    the previous one; the error names the chart's file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for suffix in ("png", "svg"):
            path = out_dir / f"{name}.{suffix}"
            tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            try:
                fig.savefig(tmp_path, format=suffix, dpi=120, bbox_inches="tight")
                os.replace(tmp_path, path)
            except OSError as error:
                tmp_path.unlink(missing_ok=True)
                raise OSError(error.errno, error.strerror or str(error), str(path)) from error
    finally:
        plt.close(fig)
