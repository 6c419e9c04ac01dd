"""``engine.stream_tables``: an experiment's step and request tables written run by run, as they
are produced, instead of kept in memory until the end (traces of millions of requests).

Each run writes ``steps/run-NNNN.parquet`` (streamed while it simulates, in chunks of
``CHUNK_ROWS`` steps) and ``requests/run-NNNN.parquet`` (when it ends); ``pd.read_parquet(DIR)``
reads a folder as one table. Only the rows of each chunk that the memory-over-time chart draws
(its envelope, ``memory_chart_rows``) stay in memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.core.specs import Deployment
from kvbench.engine.records import StepSink
from kvbench.plots.time_series import CHART_BUCKETS, memory_chart_rows
from kvbench.tables.parquet_stream import ParquetStream
from kvbench.tasks.simulate.table import step_table

# Buckets of each streamed chunk's envelope kept for the chart (a chunk holds 65,536 steps): as
# many as the whole chart has, so a chunk's peaks survive however many chunks the run has.
PLOT_BUCKETS_PER_CHUNK = CHART_BUCKETS


def remove_run_files(output_dir: Path) -> None:
    """Delete the per-run files an earlier experiment streamed into ``output_dir``: read as one
    table with this experiment's, they would add runs its summary does not have."""
    for table in ("steps", "requests"):
        for path in (output_dir / table).glob("run-*.parquet"):
            path.unlink()


class StreamedTables:
    """The per-run parquet streams of one experiment's output folder."""

    def __init__(self, output_dir: Path, metadata: dict[str, str]) -> None:
        remove_run_files(output_dir)
        self.output_dir = output_dir
        self.metadata = metadata
        self.plot_steps: list[pd.DataFrame] = []
        self._num_runs = 0
        self._steps: ParquetStream | None = None

    def start_run(self, labels: dict, deployment: Deployment) -> StepSink:
        """Open the next run's steps file; returns the engine's step sink for it."""
        self._steps = ParquetStream(self._path("steps"), self.metadata)
        steps = self._steps

        def write_chunk(columns: dict[str, np.ndarray]) -> None:
            frame = step_table(columns, deployment).assign(**labels)
            steps.write_frame(frame)
            self.plot_steps.append(memory_chart_rows(frame, PLOT_BUCKETS_PER_CHUNK))

        return write_chunk

    def end_run(self, requests: pd.DataFrame) -> None:
        """Publish the run's steps file and write its requests table."""
        assert self._steps is not None, "start_run first"
        self._steps.close()
        requests_out = ParquetStream(self._path("requests"), self.metadata)
        requests_out.write_frame(requests)
        requests_out.close()
        self._num_runs += 1

    def _path(self, table: str) -> Path:
        return self.output_dir / table / f"run-{self._num_runs:04d}.parquet"
