"""Tell how a local trace file stores its records from its first bytes, never its extension."""

from __future__ import annotations

from pathlib import Path

from kvbench.workloads.errors import TraceError
from kvbench.workloads.locations import CSV, JSON_LIST, JSONL, PARQUET

_PARQUET_MAGIC = b"PAR1"
_UTF8_BOM = b"\xef\xbb\xbf"
_HEAD_BYTES = 4096


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
