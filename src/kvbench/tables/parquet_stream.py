"""Parquet files written chunk by chunk while the engine runs (``simulate``'s sinks).

For traces too long to keep every step (and every request) in memory: each chunk the engine hands
over is appended to the file as a row group. The file is written beside its destination (a
temporary file of ``kvbench.tables.atomic``) and published by ``close`` (flushed, then renamed into
place), with the same provenance metadata as ``kvbench.tables.parquet.write_table``: until then a
reader finds no file, never one cut after some row groups. A failed write (a full disk) removes the
temporary file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.engine.records import RequestRecord
from kvbench.tables.atomic import naming, publish, temporary_path
from kvbench.tables.kill_points import kill_point
from kvbench.tables.parquet import METADATA_KEY
from kvbench.tables.record_columns import record_columns


class ParquetStream:
    """Appends column chunks to one parquet file; ``close`` publishes it."""

    def __init__(self, path: Path, metadata: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.num_rows = 0
        self._metadata = {METADATA_KEY: json.dumps(metadata).encode()}
        self._tmp_path = temporary_path(path)
        self._writer: pq.ParquetWriter | None = None

    def write_columns(self, columns: Mapping[str, Sequence | np.ndarray]) -> None:
        """Append one chunk of rows, given column by column (a ``step_sink``)."""
        self._write(pa.table(columns))

    def write_frame(self, frame: pd.DataFrame) -> None:
        """Append the rows of a table."""
        if len(frame):
            self._write(pa.Table.from_pandas(frame, preserve_index=False))

    def _write(self, table: pa.Table) -> None:
        try:
            if self._writer is None:
                schema = table.schema.with_metadata(self._metadata)
                self._writer = pq.ParquetWriter(self._tmp_path, schema)
            self._writer.write_table(table.cast(self._writer.schema))
        except OSError as error:
            self._discard()
            raise naming(error, self.path) from error
        self.num_rows += table.num_rows
        kill_point(self.path, "chunk")

    def write_records(self, records: list[RequestRecord]) -> None:
        """Append request records (a ``record_sink``)."""
        if records:
            self.write_columns(record_columns(records, RequestRecord))

    def close(self) -> Path:
        """Finish the file and publish it (flushed, then renamed into place)."""
        if self._writer is not None:
            try:
                self._writer.close()
                kill_point(self.path, "written")
                publish(self._tmp_path, self.path)
            except OSError as error:
                self._discard()
                raise naming(error, self.path) from error
            kill_point(self.path, "published")
        return self.path

    def _discard(self) -> None:
        """Drop the temporary file after a failed write (the destination keeps what it held)."""
        if self._writer is not None:
            with contextlib.suppress(OSError):  # closing writes the footer: it may fail again
                self._writer.close()
            self._writer = None
        self._tmp_path.unlink(missing_ok=True)
