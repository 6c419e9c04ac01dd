"""What every chart of kvbench shares: the non-interactive backend, one colour (and line style)
per allocator, the largest figure size, and how a figure is saved (PNG, and SVG or PDF beside it
when ``kvbench.plots.chart_formats`` asks)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from kvbench.plots import saved_formats

# One colour per allocator in every chart of the project (tests/test_charts.py checks each chart).
ALLOCATOR_COLORS = {
    "naive_max": "#e03131",
    "naive_pow2": "#f59f00",
    "naive_oracle": "#862e9c",
    "paged": "#1c7ed6",
    "paged_prefix": "#2b8a3e",
    "radix": "#0c8599",
    "paged_hybrid": "#d6336c",
    "paged_hybrid_prefix": "#a61e4d",
    # vAttention by page size (kv_designs charts): greens for small pages, orange for 2 MiB.
    "vattention": "#66a80f",
    "vattention_64k": "#74b816",
    "vattention_128k": "#5c940d",
    "vattention_256k": "#94d82d",
    "vattention_2m": "#e8590c",
}
OTHER_COLOR = "#868e96"
# paged and paged_prefix often draw the same numbers (no shared prefix): a dashed line on a solid
# one keeps both visible.
ALLOCATOR_LINESTYLES = {"paged_prefix": "--", "paged_hybrid_prefix": "--"}
# Every chart fits a laptop screen and a slide: at most 12 x 7 inches (at 120 dpi, 1440 x 840).
MAX_FIGURE_INCHES = (12.0, 7.0)
DPI = 120


def allocator_color(name: str) -> str:
    """The allocator's colour in every chart (grey for a name kvbench does not know)."""
    return ALLOCATOR_COLORS.get(name, OTHER_COLOR)


def allocator_linestyle(name: str) -> str:
    """The allocator's line style in line charts (solid unless it would hide another's line)."""
    return ALLOCATOR_LINESTYLES.get(name, "-")


def figure_size(width_in: float, height_in: float) -> tuple[float, float]:
    """``(width, height)`` in inches, capped at ``MAX_FIGURE_INCHES``."""
    return min(width_in, MAX_FIGURE_INCHES[0]), min(height_in, MAX_FIGURE_INCHES[1])


def save_figure(fig: Figure, out_dir: Path, name: str) -> None:
    """Write ``out_dir/name.png`` (and ``.svg``, ``.pdf``: ``kvbench.plots.saved_formats``),
    creating the folder, and close the figure.

    The layout engine (constrained layout) runs once, by itself: not through a draw
    (``draw_without_rendering`` would also draw every artist, for nothing), and not again for
    each file. Every file is cropped to the figure's tight box (``bbox_inches="tight"``), which
    is found once: ``savefig(bbox_inches="tight")`` draws the figure twice per file, running its
    layout engine each time, and laying out the text of every tick and label is most of a
    chart's cost.
    Each file is drawn beside its place (``.NAME.tmp-PID``, as ``kvbench.tables.atomic`` names
    it) and renamed into it: a killed run leaves no half-drawn chart, a failed write (a full disk)
    the previous one; the error names the chart's file.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        fig.set_dpi(DPI)
        layout = fig.get_layout_engine()
        if layout is not None:
            layout.execute(fig)  # at DPI: the positions every file is drawn at
            with plt.rc_context({"figure.autolayout": False,
                                 "figure.constrained_layout.use": False}):  # fmt: skip
                fig.set_layout_engine(None)  # keep that layout: the files' draws need not redo it
        tight_box = fig.get_tightbbox().padded(plt.rcParams["savefig.pad_inches"])
        for suffix in saved_formats():
            path = out_dir / f"{name}.{suffix}"
            tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            try:
                fig.savefig(tmp_path, format=suffix, dpi=DPI, bbox_inches=tight_box)
                os.replace(tmp_path, path)
            except OSError as error:
                tmp_path.unlink(missing_ok=True)
                raise OSError(error.errno, error.strerror or str(error), str(path)) from error
    finally:
        plt.close(fig)
