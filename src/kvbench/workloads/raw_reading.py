"""A trace file's own rows, before any format is known.

* :func:`sniff_container` tells how a local file stores its records from its first bytes, never
  its extension;
* :func:`read_local_frame` reads a local CSV with pandas and a parquet file with pyarrow (what
  the ``datasets`` library's builders call for them, without its 0.7 s import), JSON and every
  hub dataset (:func:`read_hub_frame`) through ``datasets``, which parses them with Arrow and
  caches the result. Its progress bars and error logging are silenced while kvbench calls it:
  a failed load is re-diagnosed and reported as one TraceError line instead;
* :func:`require_utf8` checks that a text file is UTF-8 before any reader sees it (naming the
  line and column of the first bad byte);
* :func:`diagnose_unreadable` finds where a file is broken after the fast reader gave up on it.
  The fast path never pays for these scans; they run only when a load failed, and either raise a
  :class:`TraceError` naming the line, or return a slow but lenient DataFrame of the file so that
  the column checks can name the bad value;
* :func:`saved_hash_block_tokens` reads back what ``save_trace`` wrote in a parquet file's
  metadata (under :data:`TRACE_METADATA_KEY`).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import warnings
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
    TEXT_COLUMNS,
    TraceError,
    csv_records,
)

_PARQUET_MAGIC = b"PAR1"
_UTF8_BOM = b"\xef\xbb\xbf"
_HEAD_BYTES = 4096
_UTF8_CHUNK_BYTES = 1 << 20
_BUILDER_BY_CONTAINER = {JSONL: "json", JSON_LIST: "json"}
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
    if container != PARQUET:
        require_utf8(path)  # Arrow's JSON reader lets bad bytes through into its strings
    # pandas renames a CSV's repeated column (x, x.1): the header itself, read once.
    csv_header = _csv_header(path) if container == CSV else None
    try:
        frame = _read_local(path, container, csv_header)
    except Exception as error:  # the readers raise parse errors of several types: diagnose all
        frame = diagnose_unreadable(path, container, error)
    frame.columns = [str(name).strip() for name in frame.columns]
    _require_unique_columns(path, container, csv_header or list(frame.columns))
    if frame.empty:
        raise TraceError(path, "line 2" if container == CSV else "line 1",
                         "the file holds no data rows", "at least one request")
    return frame


def _read_local(path: Path, container: str, csv_header: list[str] | None) -> pd.DataFrame:
    """A CSV (``csv_header``: its column names) with pandas and a parquet file with pyarrow,
    which is what ``datasets``' builders call for them, without its import (0.7 s, more than
    reading a 20k-row trace) and its cache folder; JSON through ``datasets``, whose reader takes
    nested records and lists."""
    if container == CSV:
        # By position: pandas keeps a blank after a name ("input "), the header read here not.
        text_dtypes = {position: str for position, name in enumerate(csv_header or [])
                       if name in TEXT_COLUMNS}  # fmt: skip
        with warnings.catch_warnings():
            # index_col=False: rows of one field more than the header (a trailing comma) are
            # not read with their first value as the index, every value one column left; pandas
            # drops the extra field, and warns when it is not empty: then the exact reader
            # names the line.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            # Only an empty cell is missing: pandas' other NA words ("None", "NA", "nan") are a
            # prompt's text, or a value the column checks name. low_memory=False: whole columns
            # typed at once.
            frame = pd.read_csv(path, index_col=False, keep_default_na=False, na_values=[""],
                                dtype=text_dtypes, low_memory=False, **_CSV_OPTIONS)  # fmt: skip
        return _diagnose_csv(path) if frame.empty else frame  # a header alone: it names that
    if container == PARQUET:
        return pq.read_table(path).to_pandas()
    import datasets

    with _quiet_datasets():
        # on_mixed_types=None: a field of mixed types (a string in one record, a number in the
        # next) stays an error, and the exact reader of ``diagnose_unreadable`` keeps each
        # value's type. By default datasets encodes such a field as JSON and reads it back:
        # the string "0" came back as the number 0, and the error blamed its valid record.
        dataset = datasets.load_dataset(
            _BUILDER_BY_CONTAINER[container], data_files=str(path), split="train",
            on_mixed_types=None,
        )  # fmt: skip
        return dataset.to_pandas()


def _csv_header(path: Path) -> list[str]:
    """The column names of a CSV's first record, stripped."""
    _, header = next(csv_records(path), (1, []))
    return [name.strip() for name in header]


def _require_unique_columns(path: Path, container: str, columns: list[str]) -> None:
    """A column name given twice would make every later look-up ambiguous: name it."""
    seen: set[str] = set()
    for name in filter(None, columns):  # unnamed columns (a trailing comma) are never looked up
        if name in seen:
            where = {CSV: "line 1", JSONL: "line 1", JSON_LIST: "record 1"}.get(container, "row 1")
            raise TraceError(path, where, f"column {name!r} appears twice", "one column per name")
        seen.add(name)


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
    try:
        value = json.loads(metadata[TRACE_METADATA_KEY]).get(HASH_BLOCK_TOKENS_ATTR, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(value)
    except (ValueError, AttributeError):  # not JSON, not an object, not a count
        raise TraceError(path, "row 1", f"unreadable {TRACE_METADATA_KEY.decode()} metadata "
                         f"({metadata[TRACE_METADATA_KEY][:80]!r})",
                         f'{{"{HASH_BLOCK_TOKENS_ATTR}": <tokens per block hash>}} as save_trace '
                         "writes it") from None
    return value


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


def require_utf8(path: Path) -> None:
    """Raise a TraceError at the line and column of the first byte that is not UTF-8 text.

    Decoded a megabyte at a time (the 3 MB Mooncake trace: 1.4 ms); the whole file is held in
    memory only to locate an error.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(_UTF8_CHUNK_BYTES):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        _raise_at_first_non_utf8_byte(path)


def _raise_at_first_non_utf8_byte(path: Path) -> None:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        # Lines end as the readers end them: \n, \r\n or a lone \r.
        before = data[: error.start].decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        line = before.count("\n") + 1
        column = len(before) - before.rfind("\n")
        raise TraceError(path, f"line {line}",
                         f"byte 0x{data[error.start]:02x} at column {column} is not UTF-8 text",
                         "a UTF-8 text file (save it as UTF-8)") from None


def _numbered_non_blank_lines(path: Path) -> list[tuple[int, str]]:
    # Lines as the readers count them: \n, \r\n and a lone \r all end one; a BOM is no text.
    with path.open(encoding="utf-8-sig", errors="replace") as handle:
        return [(number, line) for number, line in enumerate(handle, start=1) if line.strip()]


def _diagnose_csv(path: Path) -> pd.DataFrame:
    records = list(csv_records(path))
    if not records:  # nothing but blank records, e.g. a line of ""
        raise TraceError(path, "line 1", "the file holds no CSV header", "a CSV header line")
    header_line, header_fields = records[0]
    if len(records) == 1:
        raise TraceError(path, f"line {header_line + 1}", "the file has a header but no data rows",
                         "one request per line after the header")
    header = [name.strip() for name in header_fields]
    _require_unique_columns(path, CSV, header)
    rows = []
    for line_number, fields in records[1:]:
        if len(fields) > len(header) and not any(fields[len(header):]):
            fields = fields[: len(header)]  # a trailing comma: an empty field no column names
        if len(fields) != len(header):
            raise TraceError(path, f"line {line_number}",
                             f"{len(fields)} fields where the header has {len(header)}",
                             "one value per header column")
        rows.append(fields)
    # Values of mixed types: keep everything as text and let the column checks name the row.
    return pd.DataFrame(rows, columns=header, dtype=object)


def _diagnose_json_lines(path: Path) -> pd.DataFrame:
    records = []
    for line_number, text in _numbered_non_blank_lines(path):
        try:
            record = json.loads(text.rstrip("\r\n"))  # keeps errors at the end on this line
        except json.JSONDecodeError as error:
            raise TraceError(path, f"line {line_number}",
                             f"malformed JSON ({error.msg} at column {error.colno})",
                             "one JSON object per line") from None
        except RecursionError:
            raise TraceError(path, f"line {line_number}", "JSON nested too deeply",
                             "one JSON object per line") from None
        if not isinstance(record, dict):
            raise TraceError(path, f"line {line_number}", f"a JSON {type(record).__name__}",
                             "one JSON object per line")
        _require_unicode(path, f"line {line_number}", record)
        records.append(record)
    if not records:
        raise TraceError(path, "line 1", "the file holds no records", "one JSON object per line")
    return pd.DataFrame.from_records(records)


def _diagnose_json_list(path: Path) -> pd.DataFrame:
    try:
        with path.open(encoding="utf-8-sig") as handle:
            records = json.load(handle)
    except json.JSONDecodeError as error:
        raise TraceError(path, f"line {error.lineno}",
                         f"malformed JSON ({error.msg} at column {error.colno})",
                         "a JSON list of objects") from None
    except RecursionError:
        raise TraceError(path, "line 1", "JSON nested too deeply", "a JSON list of objects") \
            from None
    if not isinstance(records, list) or not records:
        problem = "an empty JSON list" if records == [] else f"a JSON {type(records).__name__}"
        raise TraceError(path, "line 1", problem, "a JSON list of objects")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise TraceError(path, f"record {index + 1}", f"a JSON {type(record).__name__}",
                             "a JSON object")
        _require_unicode(path, f"record {index + 1}", record)
    return pd.DataFrame.from_records(records)


def _require_unicode(path: Path, location: str, record: dict) -> None:
    """Raise a TraceError when a text of ``record`` holds half a surrogate pair (JSON's escape
    ``\\ud83d`` without its ``\\ude00``): no Unicode text, and no reader or tokenizer takes it."""
    pending: list[object] = [record]
    while pending:  # iteratively: JSON nests as deep as the parser allowed
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                escape = f"\\u{ord(value[error.start]):04x}"
                raise TraceError(path, location, f"a text holds {escape}, half a surrogate pair",
                                 "JSON text of valid Unicode (\\uXXXX escapes of surrogates in "
                                 "pairs)") from None
