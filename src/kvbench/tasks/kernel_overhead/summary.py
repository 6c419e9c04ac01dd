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


def overhead_cells(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per block size, one column per context length, cells the
    overhead in % with one decimal (``-`` where not measured)."""
    pivot = table.pivot_table(index="block_size", columns="context_len", values="overhead_pct")
    header = ["block size", *(f"{int(length)} tok" for length in pivot.columns)]
    rows = [
        [str(int(block_size)), *("-" if pd.isna(value) else f"{value:+.1f}" for value in values)]
        for block_size, values in zip(pivot.index, pivot.to_numpy(), strict=True)
    ]
    return header, rows


def overhead_text(table: pd.DataFrame) -> str:
    """The terminal's summary: the title and the block size x context length table."""
    header, rows = overhead_cells(table)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in [header, *rows]]  # fmt: skip
    return "\n".join([overhead_title(table), "", *lines])


def overhead_markdown(table: pd.DataFrame) -> str:
    """The same table in markdown, under a heading (for ``report.md``)."""
    header, rows = overhead_cells(table)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "## Overhead\n\n" + overhead_title(table) + ".\n\n" + "\n".join(lines)
