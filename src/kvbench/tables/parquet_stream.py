"""Parquet files written chunk by chunk while the engine runs (``simulate``'s sinks).

For traces too long to keep every step (and every request) in memory: each chunk the engine hands
over is appended to the file as a row group. The file is written beside its destination and renamed
into place by ``close``, with the same provenance metadata as
``kvbench.tables.parquet.write_table``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.engine.records import RequestRecord
from kvbench.tables.parquet import METADATA_KEY
from kvbench.tables.record_columns import field_names, record_columns

_RECORD_FIELDS = field_names(RequestRecord)  # the columns write_records writes, in order


class ParquetStream:
    """Appends column chunks to one parquet file; ``close`` publishes it."""

    def __init__(self, path: Path, metadata: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.num_rows = 0
        self._metadata = {METADATA_KEY: json.dumps(metadata).encode()}
        self._tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._writer: pq.ParquetWriter | None = None

    def write_columns(self, columns: Mapping[str, Sequence | np.ndarray]) -> None:
        """Append one chunk of rows, given column by column (a ``step_sink``)."""
        self._write(pa.table(columns))

    def write_frame(self, frame: pd.DataFrame) -> None:
        """Append the rows of a table."""
        if len(frame):
            self._write(pa.Table.from_pandas(frame, preserve_index=False))

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            schema = table.schema.with_metadata(self._metadata)
            self._writer = pq.ParquetWriter(self._tmp_path, schema)
        self._writer.write_table(table.cast(self._writer.schema))
        self.num_rows += table.num_rows

    def write_records(self, records: list[RequestRecord]) -> None:
        """Append request records (a ``record_sink``)."""
        if records:
            self.write_columns(record_columns(records, RequestRecord))

    def close(self) -> Path:
        """Finish the file and move it into place."""
        if self._writer is not None:
            self._writer.close()
            os.replace(self._tmp_path, self.path)
        return self.path
