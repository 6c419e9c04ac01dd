"""Chart functions drawn from result tables; the tasks decide which to draw.

Every chart is saved in the formats of ``chart_formats`` (``plot_formats`` in the config): PNG
alone by default, SVG or PDF beside it on request. Choosing them here, in a context the task
opens, keeps the chart functions' signatures about what they draw (and this module free of
matplotlib, so a run with ``plots=false`` never imports it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

# The formats a chart can be saved in (matplotlib's names, also the files' suffixes).
CHART_FORMATS = ("png", "svg", "pdf")
DEFAULT_CHART_FORMATS = ("png",)
_formats: ContextVar[tuple[str, ...]] = ContextVar("chart_formats", default=DEFAULT_CHART_FORMATS)


@contextlib.contextmanager
def chart_formats(formats: Sequence[str]) -> Iterator[None]:
    """Save every chart drawn inside the block in ``formats`` (each of ``CHART_FORMATS``)."""
    unknown = [name for name in formats if name not in CHART_FORMATS]
    if unknown or not formats:
        raise ValueError(f"chart formats {list(formats)!r} are invalid; expected one or more of "
                         f"{', '.join(CHART_FORMATS)}")
    token = _formats.set(tuple(formats))
    try:
        yield
    finally:
        _formats.reset(token)


def saved_formats() -> tuple[str, ...]:
    """The formats charts are saved in here (``chart_formats``'s, or PNG alone)."""
    return _formats.get()
