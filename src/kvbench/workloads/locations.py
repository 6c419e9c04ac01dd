"""Map a data row of a loaded trace back to where it sits in the source file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# How a file stores its records; decided from its first bytes (see sniff.py).
CSV = "csv"
JSONL = "jsonl"
JSON_LIST = "json"
PARQUET = "parquet"
HUB = "hub"


@dataclass
class RowLocator:
    """Turns a 0-based data-row index into ``line N`` / ``record N`` / ``row N`` (1-based).

    Line numbers of text formats count blank lines the readers skip, so they point at the real
    line of the file; they assume one record per line (no quoted newlines in CSV fields).
    """

    path: str
    container: str
    _data_line_numbers: list[int] | None = field(default=None, repr=False)

    def header(self) -> str:
        """Where the column names are: the header line of a CSV, else the first record."""
        return "line 1" if self.container in (CSV, JSONL) else self.row(0)

    def row(self, index: int) -> str:
        """Location of data row ``index`` (0-based, in file order)."""
        if self.container in (CSV, JSONL):
            line_numbers = self._line_numbers()
            line = line_numbers[index] if index < len(line_numbers) else index + 1
            return f"line {line}"
        if self.container == JSON_LIST:
            return f"record {index + 1}"
        return f"row {index + 1}"

    def _line_numbers(self) -> list[int]:
        # Built only on the error path: scanning the file costs as much as parsing it.
        if self._data_line_numbers is None:
            with Path(self.path).open(encoding="utf-8", errors="replace") as handle:
                non_blank = [number for number, text in enumerate(handle, start=1) if text.strip()]
            self._data_line_numbers = non_blank[1:] if self.container == CSV else non_blank
        return self._data_line_numbers
