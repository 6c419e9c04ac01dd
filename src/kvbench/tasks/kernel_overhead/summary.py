"""The kernel-overhead run's headline, as text: paged over contiguous decode attention time per
block size and context length (printed at the end of the run, and in its ``report.md``).

Pure: ``kernels.parquet``'s rows (``docs/metrics.md``) in, strings out.
"""

from __future__ import annotations

import pandas as pd


def overhead_title(table: pd.DataFrame) -> str:
    """One line: what was timed, where, and what the figures are."""
    first = table.iloc[0]
    return (f"kernel overhead: paged vs contiguous decode attention, {first['backend']} on "
            f"{first['device']}, batch {int(first['batch_size'])}: paged time / contiguous "
            "time - 1, in %")  # fmt: skip


VIRTUAL_TITLE = ("paged vs virtual-contiguous (vAttention: the contiguous kernel over spans of "
                 "max_model_len tokens): paged time / virtual-contiguous time - 1, in %")


def overhead_cells(
    table: pd.DataFrame, values: str = "overhead_pct"
) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per block size, one column per context length, cells the
    overhead (``values``: vs contiguous, or ``virtual_overhead_pct``) in % with one decimal
    (``-`` where not measured)."""
    pivot = table.pivot_table(index="block_size", columns="context_len", values=values)
    header = ["block size", *(f"{int(length)} tok" for length in pivot.columns)]
    rows = [
        [str(int(block_size)), *("-" if pd.isna(value) else f"{value:+.1f}" for value in values)]
        for block_size, values in zip(pivot.index, pivot.to_numpy(), strict=True)
    ]
    return header, rows


def overhead_text(table: pd.DataFrame) -> str:
    """The terminal's summary: the title and the block size x context length table, then the
    same against the virtual-contiguous layout."""
    blocks = []
    for title, values in ((overhead_title(table), "overhead_pct"),
                          (VIRTUAL_TITLE, "virtual_overhead_pct")):  # fmt: skip
        header, rows = overhead_cells(table, values)
        widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
                 for line in [header, *rows]]  # fmt: skip
        blocks.append("\n".join([title, "", *lines]))
    return "\n\n".join(blocks)


def overhead_markdown(table: pd.DataFrame) -> str:
    """The same tables in markdown, under a heading (for ``report.md``)."""
    sections = []
    for title, values in ((overhead_title(table), "overhead_pct"),
                          (VIRTUAL_TITLE, "virtual_overhead_pct")):  # fmt: skip
        header, rows = overhead_cells(table, values)
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        sections.append(title + ".\n\n" + "\n".join(lines))
    return "## Overhead\n\n" + "\n\n".join(sections)
