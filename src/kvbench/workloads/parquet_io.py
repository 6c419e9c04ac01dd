"""kvbench's own trace file: a parquet table of the canonical columns (``save_trace``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.workloads.columns import HASH_BLOCK_TOKENS_ATTR, OPTIONAL_COLUMNS, REQUIRED_COLUMNS

# Schema-level metadata key; its JSON value carries what DataFrame.attrs held.
METADATA_KEY = b"kvbench.trace"
_SCHEMA_VERSION = 1


def save_trace(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a trace DataFrame (as ``load_trace`` returns it) to a parquet file.

    Only the canonical columns (and the optional prefix columns, when present) are written;
    ``attrs["hash_block_tokens"]`` travels in the file's metadata. ``load_trace`` reads it back
    equal to ``df``.

    Returns:
        the path written.
    """
    missing = [name for name in REQUIRED_COLUMNS if name not in df.columns]
    if missing:
        raise ValueError(f"save_trace: missing column(s) {','.join(missing)}; expected "
                         f"{','.join(REQUIRED_COLUMNS)}")
    columns = [*REQUIRED_COLUMNS, *(name for name in OPTIONAL_COLUMNS if name in df.columns)]
    table = pa.Table.from_pandas(df[columns], preserve_index=False)
    metadata = {"version": _SCHEMA_VERSION,
                HASH_BLOCK_TOKENS_ATTR: int(df.attrs.get(HASH_BLOCK_TOKENS_ATTR, 0))}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(metadata).encode()}
    )
    target = Path(path)
    pq.write_table(table, target)
    return target


def saved_hash_block_tokens(path: Path) -> int:
    """``hash_block_tokens`` recorded by ``save_trace`` (0 for other parquet files)."""
    metadata = pq.read_schema(path).metadata or {}
    if METADATA_KEY not in metadata:
        return 0
    return int(json.loads(metadata[METADATA_KEY]).get(HASH_BLOCK_TOKENS_ATTR, 0))
