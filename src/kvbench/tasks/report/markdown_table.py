"""Markdown tables from rows of cells (no third-party formatter needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def cell(value: object, digits: int = 2) -> str:
    """A table cell: floats to ``digits`` decimals, NaN as an en dash, the rest as text."""
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:,.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], digits: int = 2) -> str:
    """A GitHub markdown table; float cells rounded to ``digits``."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(value, digits) for value in row) + " |" for row in rows]
    return "\n".join(lines)
