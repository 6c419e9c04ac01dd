"""Parquet files written chunk by chunk while the engine runs (``simulate``'s sinks), or run by
run beside the simulations (``RunsTable``).

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
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.engine.records import RequestRecord
from kvbench.tables.atomic import naming, publish, temporary_path
from kvbench.tables.kill_points import kill_point
from kvbench.tables.parquet import METADATA_KEY, arrow_table
from kvbench.tables.record_columns import record_columns


class ParquetStream:
    """Appends column chunks to one parquet file; ``close`` publishes it."""

    def __init__(self, path: Path, metadata: dict[str, str], tmp_path: Path | None = None) -> None:
        """``tmp_path``: where the file is written until ``close`` (default: ``atomic``'s
        temporary of ``path``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.num_rows = 0
        self._metadata = {METADATA_KEY: json.dumps(metadata).encode()}
        self._tmp_path = tmp_path or temporary_path(path)
        self._writer: pq.ParquetWriter | None = None

    @property
    def schema(self) -> pa.Schema | None:
        """The file's columns and types (the first chunk's); None before any chunk."""
        return None if self._writer is None else self._writer.schema

    def write_columns(self, columns: Mapping[str, Sequence | np.ndarray]) -> None:
        """Append one chunk of rows, given column by column (a ``step_sink``)."""
        self.write_table(pa.table(columns))

    def write_frame(self, frame: pd.DataFrame) -> None:
        """Append the rows of a table."""
        if len(frame):
            self.write_table(pa.Table.from_pandas(frame, preserve_index=False))

    def write_table(self, table: pa.Table) -> None:
        """Append the rows of an Arrow table (cast to the first chunk's types)."""
        try:
            if self._writer is None:
                schema = table.schema.with_metadata(self._metadata)
                self._writer = pq.ParquetWriter(self._tmp_path, schema)
            self._writer.write_table(table.cast(self._writer.schema))
        except OSError as error:
            self.discard()
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
                self.discard()
                raise naming(error, self.path) from error
            kill_point(self.path, "published")
        return self.path

    def discard(self) -> None:
        """Drop the temporary file (after a failed write: the destination keeps what it held)."""
        if self._writer is not None:
            with contextlib.suppress(OSError):  # closing writes the footer: it may fail again
                self._writer.close()
            self._writer = None
        self._tmp_path.unlink(missing_ok=True)


class RunsTable:
    """One table of an experiment (its steps, its requests) written run by run: each run's rows
    are appended as row groups by a thread while the next run simulates (pyarrow encodes without
    holding the interpreter's lock, so on a second core), and ``close`` publishes the file. The
    experiment's end then writes only its last run's rows, not the whole table. The file reads
    back as ``write_frames`` of the same runs writes it.

    Every run must bring the first run's columns and types: ``write_frames`` would promote a
    column whose type differs (an integer meeting a float), which a file already begun cannot.
    Such a run stops the appending and ``close`` returns False, publishing nothing: the caller
    writes the table whole. The file is written beside its destination under a name of its own
    (``NAME.runs``'s temporary), so a checkpoint writing the whole table meanwhile
    (``atomic_path``) never meets it; a failed write (a full disk) removes it and raises, naming
    the destination, at the next ``append`` or at ``close``.
    """

    def __init__(self, path: Path, metadata: dict[str, str]) -> None:
        self.path = path
        self._stream = ParquetStream(path, metadata,
                                     temporary_path(path.with_name(f"{path.name}.runs")))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="kvbench-runs-table")
        self._pending: deque[Future[None]] = deque()  # writes not yet checked, in order
        self._refused = False
        self._failed = False  # a write failed: the file is gone, later runs are not written

    def append(self, frame: pd.DataFrame, constants: Mapping[str, object] | None = None) -> None:
        """Hand one run's rows (``constants`` added as columns, as ``write_frames`` adds them)
        to the thread; an earlier run's failed write raises here (or at ``close``, if it is
        still under way)."""
        pending = self._pending
        while pending and pending[0].done():
            pending.popleft().result()
        pending.append(self._thread.submit(self._write, arrow_table(frame, constants)))

    def _write(self, table: pa.Table) -> None:
        if self._refused or self._failed:
            return
        schema = self._stream.schema
        if schema is not None and not table.schema.equals(schema, check_metadata=False):
            self._refused = True
            self._stream.discard()
            return
        try:
            self._stream.write_table(table)
        except OSError:
            self._failed = True  # a later run's rows would begin a file without this run's
            raise

    def close(self) -> bool:
        """Wait for the thread and publish the file; False (nothing published) when a run's
        types differed from the first's or no run came."""
        self._thread.shutdown(wait=True)
        while self._pending:
            self._pending.popleft().result()
        if self._refused or self._stream.schema is None:
            return False
        self._stream.close()
        return True

    def discard(self) -> None:
        """Stop after the write under way and remove the temporary file (an experiment that
        failed before its end)."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._stream.discard()
