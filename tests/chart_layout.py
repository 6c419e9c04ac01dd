"""Layout checks of a drawn matplotlib figure (Agg renderer): overlapping text, legends over
data, colours outside the allocator map. Each returns a list of problems (empty: fine)."""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from kvbench.plots.figure import ALLOCATOR_COLORS

# Two boxes may touch by this many pixels (antialiasing, rounding) without overlapping.
TOLERANCE_PX = 1.0


def _undrawn_tick_labels(fig: Figure) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (ticks outside the view limits)."""
    undrawn = set()
    for ax in fig.get_axes():
        for axis in (ax.xaxis, ax.yaxis):
            drawn = {id(label) for tick in axis._update_ticks()
                     for label in (tick.label1, tick.label2) if tick.get_visible()}  # fmt: skip
            ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            undrawn |= {id(label) for tick in ticks for label in (tick.label1, tick.label2)
                        if id(label) not in drawn}  # fmt: skip
    return undrawn


def _visible_texts(fig: Figure) -> list[Text]:
    renderer = fig.canvas.get_renderer()
    undrawn = _undrawn_tick_labels(fig)
    texts = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in undrawn:
            continue
        if any(isinstance(parent, Legend) for parent in _parents(text)):
            continue  # a legend's own texts are laid out by the legend
        if text.get_window_extent(renderer).width == 0:
            continue
        texts.append(text)
    return texts


def _parents(artist):
    # Text artists do not know their legend; the legend's texts are its `texts` and title.
    return [legend for legend in _legends(artist.figure)
            if artist in legend.texts or artist is legend.get_title()]  # fmt: skip


def _legends(fig: Figure) -> list[Legend]:
    legends = list(fig.legends)
    for subfig in fig.subfigs:
        legends += subfig.legends
    for ax in fig.get_axes():
        if ax.get_legend() is not None:
            legends.append(ax.get_legend())
    return legends


def _shrunk(box):
    return box.expanded(1, 1).padded(-TOLERANCE_PX)


def overlapping_texts(fig: Figure) -> list[str]:
    """Pairs of visible texts (tick labels, titles, value labels) whose boxes intersect."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _visible_texts(fig)
    boxes = [_shrunk(text.get_window_extent(renderer)) for text in texts]
    problems = []
    for (a, box_a), (b, box_b) in itertools.combinations(zip(texts, boxes, strict=True), 2):
        if box_a.overlaps(box_b):
            problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return problems


def _along(points: np.ndarray, connected: bool) -> np.ndarray:
    """The display points of a line, with its segments sampled every few pixels when drawn."""
    points = points[np.isfinite(points).all(axis=1)]
    if not connected or len(points) < 2:
        return points
    samples = [points]
    for start, end in itertools.pairwise(points):
        count = int(min(200, np.hypot(*(end - start)) // 3))
        if count > 1:
            steps = np.linspace(0, 1, count)[:, None]
            samples.append(start + steps * (end - start))
    return np.concatenate(samples)


def legends_over_data(fig: Figure) -> list[str]:
    """Legends whose box covers a data point, a bar or a value label of any axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for legend in _legends(fig):
        box = _shrunk(legend.get_window_extent(renderer))
        for ax in fig.get_axes():
            if not ax.get_visible():
                continue
            for line in ax.get_lines():
                if not line.get_visible() or len(line.get_xydata()) == 0:
                    continue
                points = _along(line.get_transform().transform(line.get_xydata()),
                                line.get_linestyle() not in ("None", "", " "))
                if box.count_contains(points):
                    problems.append(f"legend covers line {line.get_label()!r}")
            for patch in ax.patches:
                extent = patch.get_window_extent(renderer)
                if isinstance(patch, Rectangle) and extent.width > 0 and box.overlaps(extent):
                    problems.append("legend covers a bar")
            for text in ax.texts:
                if text.get_visible() and box.overlaps(text.get_window_extent(renderer)):
                    problems.append(f"legend covers the label {text.get_text()!r}")
    return problems


def _is_neutral(color) -> bool:
    red, green, blue = to_rgb(color)
    return max(red, green, blue) - min(red, green, blue) < 0.12


def foreign_colors(fig: Figure) -> list[str]:
    """Colours of lines and bars that are neither grey nor an allocator's colour, and lines
    labelled with an allocator's name (possibly after a prefix) drawn in another's colour."""
    palette = {color.lower() for color in ALLOCATOR_COLORS.values()}
    problems = []
    for ax in fig.get_axes():
        for line in ax.get_lines():
            color = to_hex(line.get_color())
            if not _is_neutral(color) and color not in palette:
                problems.append(f"line {line.get_label()!r} is {color}")
            for name, expected in ALLOCATOR_COLORS.items():
                label = str(line.get_label())
                if (label == name or label.endswith(f": {name}")) and color != expected.lower():
                    problems.append(f"line {label!r} is {color}, not {expected}")
        for patch in ax.patches:
            color = to_hex(patch.get_facecolor())
            if patch.get_visible() and not _is_neutral(color) and color not in palette:
                problems.append(f"a bar is {color}")
    return problems


def used_allocator_colors(fig: Figure) -> set[str]:
    """The allocator names whose colour some line or bar of the figure has."""
    by_color = {color.lower(): name for name, color in ALLOCATOR_COLORS.items()}
    found = set()
    for ax in fig.get_axes():
        colors = [to_hex(line.get_color()) for line in ax.get_lines()]
        colors += [to_hex(patch.get_facecolor()) for patch in ax.patches]
        found |= {by_color[color] for color in colors if color in by_color}
    return found


def layout_problems(fig: Figure) -> list[str]:
    """Every problem the checks above find."""
    return overlapping_texts(fig) + legends_over_data(fig) + foreign_colors(fig)

