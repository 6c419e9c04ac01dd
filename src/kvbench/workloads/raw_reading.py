"""A trace file's own rows, before any format is known.

* :func:`sniff_container` tells how a local file stores its records from its first bytes, never
  its extension;
* :func:`read_local_frame` / :func:`read_hub_frame` read them through the ``datasets`` library,
  which parses CSV/JSON/parquet with Arrow and caches the result (a 30k-row CSV: ~0.3 s the first
  time, ~0.01 s after). Its progress bars and error logging are silenced while kvbench calls it:
  a failed load is re-diagnosed and reported as one TraceError line instead;
* :func:`diagnose_unreadable` finds where a file is broken after the fast reader gave up on it.
  The fast path never pays for these scans; they run only when a load failed, and either raise a
  :class:`TraceError` naming the line, or return a slow but lenient DataFrame of the file so that
  the column checks can name the bad value;
* :func:`saved_hash_block_tokens` reads back what ``save_trace`` wrote in a parquet file's
  metadata (under :data:`TRACE_METADATA_KEY`).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from kvbench.workloads.hub import (
    HUB_TRACE_FIX,
    LOCAL_TRACE_FIX,
    check_hub_id,
    hub_is_offline,
    offline_error,
)
from kvbench.workloads.schema import (
    CSV,
    HASH_BLOCK_TOKENS_ATTR,
    JSON_LIST,
    JSONL,
    PARQUET,
    TraceError,
)

_PARQUET_MAGIC = b"PAR1"
_UTF8_BOM = b"\xef\xbb\xbf"
_HEAD_BYTES = 4096
_BUILDER_BY_CONTAINER = {CSV: "csv", JSONL: "json", JSON_LIST: "json", PARQUET: "parquet"}
# "TIMESTAMP, ContextTokens": pandas would keep the blank in the name and in values.
_CSV_OPTIONS = {"skipinitialspace": True}
# Schema-level metadata key of kvbench's own parquet trace; its JSON value carries what
# DataFrame.attrs held.
TRACE_METADATA_KEY = b"kvbench.trace"

# --- The container ---


def sniff_container(path: Path) -> str:
    """``parquet`` (PAR1 magic), ``json`` (a JSON list: first non-blank character ``[``),
    ``jsonl`` (first non-blank character ``{``) or ``csv`` (anything else: a header line).

    Which trace format the file holds is decided afterwards, from its column names.

    Raises:
        TraceError: the file is empty (or holds only blanks).
    """
    with path.open("rb") as handle:
        head = handle.read(_HEAD_BYTES)
    if head.startswith(_PARQUET_MAGIC):
        return PARQUET
    first_char = head.removeprefix(_UTF8_BOM).lstrip()[:1]
    if not first_char:
        raise TraceError(path, "line 1", "the file is empty", "a CSV header line or JSON records")
    if first_char == b"[":
        return JSON_LIST
    if first_char == b"{":
        return JSONL
    return CSV


# --- Raw rows ---


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets

    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets_logger = logging.getLogger("datasets")
    previous_level = datasets_logger.level
    datasets.disable_progress_bars()
    datasets_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logger.setLevel(previous_level)
        if not bars_were_disabled:
            datasets.enable_progress_bars()


def read_local_frame(path: Path, container: str) -> pd.DataFrame:
    """All rows of the local file ``path`` with its own column names (stripped of blanks)."""
    import datasets

    options = _CSV_OPTIONS if container == CSV else {}
    try:
        with _quiet_datasets():
            dataset = datasets.load_dataset(
                _BUILDER_BY_CONTAINER[container], data_files=str(path), split="train", **options
            )
    except Exception as error:  # datasets wraps parse errors in several types; diagnose them all
        frame = diagnose_unreadable(path, container, error)
    else:
        frame = dataset.to_pandas()
    frame.columns = [str(name).strip() for name in frame.columns]
    if frame.empty:
        raise TraceError(path, "line 2" if container == CSV else "line 1",
                         "the file holds no data rows", "at least one request")
    return frame


def read_hub_frame(hub_id: str) -> pd.DataFrame:
    """The ``train`` split of a Hugging Face hub dataset (needs network).

    ``hub_id`` is ``owner/name``, optionally followed by ``/path/in/repo`` to pick one data file
    (e.g. ``anon8231489123/ShareGPT_Vicuna_unfiltered/ShareGPT_V3_unfiltered_cleaned_split.json``).
    """
    import datasets

    owner, name, *file_parts = hub_id.split("/")
    data_files = "/".join(file_parts) or None
    if not hub_is_offline():  # offline, datasets reads its cache or says in one line it cannot
        check_hub_id(f"{owner}/{name}", "dataset", "trace", HUB_TRACE_FIX)
    # Not silenced: a download deserves its progress bars.
    try:
        dataset = datasets.load_dataset(f"{owner}/{name}", data_files=data_files, split="train")
    except ConnectionError:
        if not hub_is_offline():
            raise
        raise offline_error(f"{owner}/{name}", "trace", LOCAL_TRACE_FIX) from None
    return dataset.to_pandas()


def saved_hash_block_tokens(path: Path) -> int:
    """``hash_block_tokens`` recorded by ``save_trace`` (0 for other parquet files)."""
    metadata = pq.read_schema(path).metadata or {}
    if TRACE_METADATA_KEY not in metadata:
        return 0
    return int(json.loads(metadata[TRACE_METADATA_KEY]).get(HASH_BLOCK_TOKENS_ATTR, 0))


# --- Diagnosis of a file the fast reader could not load ---


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
