"""Find where a trace file is broken after the fast reader (``datasets``) gave up on it.

The fast path never pays for these scans; they run only when a load failed, and either raise a
:class:`TraceError` naming the line, or return a slow but lenient DataFrame of the file so that
the column checks can name the bad value.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd

from kvbench.workloads.errors import TraceError
from kvbench.workloads.locations import CSV, JSON_LIST, JSONL


def diagnose_unreadable(path: Path, container: str, cause: Exception) -> pd.DataFrame:
    """Raise a TraceError for the first broken line of ``path``, or return its rows leniently."""
    if container == CSV:
        return _diagnose_csv(path)
    if container == JSONL:
        return _diagnose_json_lines(path)
    if container == JSON_LIST:
        return _diagnose_json_list(path)
    raise TraceError(path, "row 1", f"unreadable file ({cause})", "a parquet file (save_trace)")


def _numbered_non_blank_lines(path: Path) -> list[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        return [(number, line) for number, line in enumerate(handle, start=1) if line.strip()]


def _diagnose_csv(path: Path) -> pd.DataFrame:
    lines = _numbered_non_blank_lines(path)
    header_line, header_text = lines[0]
    if len(lines) == 1:
        raise TraceError(path, f"line {header_line + 1}", "the file has a header but no data rows",
                         "one request per line after the header")
    num_columns = len(next(csv.reader([header_text])))
    for line_number, text in lines[1:]:
        num_fields = len(next(csv.reader([text])))
        if num_fields != num_columns:
            raise TraceError(path, f"line {line_number}",
                             f"{num_fields} fields where the header has {num_columns}",
                             "one value per header column")
    # Values of mixed types: read everything as text and let the column checks name the row.
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    frame.columns = [str(name).strip() for name in frame.columns]
    return frame


def _diagnose_json_lines(path: Path) -> pd.DataFrame:
    records = []
    for line_number, text in _numbered_non_blank_lines(path):
        try:
            record = json.loads(text.rstrip("\r\n"))  # keeps errors at the end on this line
        except json.JSONDecodeError as error:
            raise TraceError(path, f"line {line_number}",
                             f"malformed JSON ({error.msg} at column {error.colno})",
                             "one JSON object per line") from None
        if not isinstance(record, dict):
            raise TraceError(path, f"line {line_number}", f"a JSON {type(record).__name__}",
                             "one JSON object per line")
        records.append(record)
    if not records:
        raise TraceError(path, "line 1", "the file holds no records", "one JSON object per line")
    return pd.DataFrame.from_records(records)


def _diagnose_json_list(path: Path) -> pd.DataFrame:
    try:
        with path.open(encoding="utf-8") as handle:
            records = json.load(handle)
    except json.JSONDecodeError as error:
        raise TraceError(path, f"line {error.lineno}",
                         f"malformed JSON ({error.msg} at column {error.colno})",
                         "a JSON list of objects") from None
    if not isinstance(records, list) or not records:
        problem = "an empty JSON list" if records == [] else f"a JSON {type(records).__name__}"
        raise TraceError(path, "line 1", problem, "a JSON list of objects")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise TraceError(path, f"record {index + 1}", f"a JSON {type(record).__name__}",
                             "a JSON object")
    return pd.DataFrame.from_records(records)
