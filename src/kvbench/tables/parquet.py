"""Writing and reading kvbench's parquet tables (atomically, with provenance metadata)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.tables.atomic import atomic_path

METADATA_KEY = b"kvbench"


def write_table(frame: pd.DataFrame, path: Path, metadata: dict[str, str]) -> Path:
    """Write ``frame`` to ``path`` with ``metadata`` in the parquet footer.

    The file is written beside its destination, flushed and renamed into place
    (``kvbench.tables.atomic``), so a killed run never leaves a half-written parquet and a failed
    write (a full disk) leaves the previous file as it was.
    """
    return _write_arrow(pa.Table.from_pandas(frame, preserve_index=False), path, metadata)


def write_frames(
    frames: Sequence[pd.DataFrame],
    path: Path,
    metadata: dict[str, str],
    constants: Sequence[Mapping[str, object]] | None = None,
) -> Path:
    """``write_table`` of the frames one under another, as ``pd.concat(frames)`` would stack them,
    without building that frame: each frame becomes an Arrow table (its columns mostly shared,
    not copied), and the tables are joined without copying, their column types promoted as
    concat would (an integer column meeting a float one becomes float, an all-None one takes the
    other's type). The columns must be the same, in the same order.

    ``constants[i]``, when given, adds to frame ``i`` one column per key holding its value on
    every row, after the frame's own columns: the table ``frame.assign(**constants[i])`` would
    give, built in Arrow (a repeated value) rather than as pandas columns."""
    tables = [arrow_table(frame, constants[position] if constants else None)
              for position, frame in enumerate(frames)]  # fmt: skip
    return _write_arrow(pa.concat_tables(tables, promote_options="permissive"), path, metadata)


def arrow_table(frame: pd.DataFrame, constants: Mapping[str, object] | None = None) -> pa.Table:
    """``frame`` as an Arrow table, with one column per key of ``constants`` holding its value
    on every row after the frame's own (``frame.assign(**constants)``, built in Arrow)."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for name, value in (constants or {}).items():
        table = table.append_column(name, pa.repeat(value, table.num_rows))
    return table


def _write_arrow(table: pa.Table, path: Path, metadata: dict[str, str]) -> Path:
    schema_metadata = dict(table.schema.metadata or {})
    schema_metadata[METADATA_KEY] = json.dumps(metadata).encode()
    table = table.replace_schema_metadata(schema_metadata)
    with atomic_path(path) as tmp_path:
        pq.write_table(table, tmp_path)
    return path


def read_metadata(path: Path) -> dict[str, str]:
    """The provenance stored by ``write_table``."""
    schema_metadata = pq.read_schema(path).metadata or {}
    return json.loads(schema_metadata.get(METADATA_KEY, b"{}"))
