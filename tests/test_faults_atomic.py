"""The atomic writers one by one, in process: a write that fails half-way leaves the previous file
and no temporary one, names the file, and a full disk says so; a new run clears what a killed
one left (its DONE, its temporaries) and nothing of a live writer."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kvbench.plots import chart_formats
from kvbench.plots import figure as figure_module
from kvbench.tables import parquet as parquet_module
from kvbench.tables.atomic import (
    atomic_path,
    remove_stale_temporaries,
    temporary_path,
)
from kvbench.tables.done_marker import DONE_NAME, is_done, mark_done, start_run
from kvbench.tables.parquet import write_table
from kvbench.tables.parquet_stream import ParquetStream

FRAME = pd.DataFrame({"a": [1, 2, 3]})


def _disk_full(table, path, *args, **kwargs):
    """A writer that gets half its file out, then finds the disk full (as pyarrow reports it:
    without the file's name)."""
    with open(path, "wb") as handle:
        handle.write(b"PAR1 half a table")
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left")


def test_a_table_that_cannot_be_written_leaves_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "summary.parquet"
    write_table(FRAME, path, {"run": "first"})
    before = path.read_bytes()
    monkeypatch.setattr(parquet_module.pq, "write_table", _disk_full)
    with pytest.raises(OSError) as caught:
        write_table(pd.DataFrame({"a": [9]}), path, {"run": "second"})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["summary.parquet"]  # no temporary left
    assert caught.value.filename == str(path)  # pyarrow names no file: the writer does
    assert caught.value.errno == errno.ENOSPC


def test_an_error_in_the_block_publishes_nothing(tmp_path):
    path = tmp_path / "DONE"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("new, half")
        raise RuntimeError("stopped")
    assert path.read_text() == "old"
    assert list(tmp_path.iterdir()) == [path]


def test_a_stream_that_fails_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "steps" / "run-0000.parquet"
    stream = ParquetStream(path, {"run": "x"})
    stream.write_frame(FRAME)
    assert not path.exists() and temporary_path(path).exists()  # rows go to the hidden file

    def full(*args, **kwargs):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(stream._writer, "write_table", full)
    with pytest.raises(OSError) as caught:
        stream.write_frame(FRAME)
    assert caught.value.filename == str(path)
    assert list(path.parent.iterdir()) == []


def test_a_closed_stream_is_whole(tmp_path):
    path = tmp_path / "requests" / "run-0000.parquet"
    stream = ParquetStream(path, {"run": "x"})
    stream.write_frame(FRAME)
    stream.write_frame(FRAME)
    stream.close()
    assert pq.read_table(path).num_rows == 6
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_chart_that_cannot_be_saved_keeps_the_old_one(tmp_path, monkeypatch):
    fig, axes = plt.subplots()
    axes.plot([1, 2, 3])
    with chart_formats(("png", "svg")):
        figure_module.save_figure(fig, tmp_path, "chart")
    before = (tmp_path / "chart.svg").read_bytes()

    def full(self, path, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"<svg half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(figure_module.Figure, "savefig", full)
    fig, axes = plt.subplots()
    with pytest.raises(OSError) as caught, chart_formats(("png", "svg")):
        figure_module.save_figure(fig, tmp_path, "chart")
    assert caught.value.filename == str(tmp_path / "chart.png")
    assert (tmp_path / "chart.svg").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png", "chart.svg"]


def _dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return int(process.stdout)


def test_a_new_run_removes_the_done_marker_and_dead_writers_temporaries(tmp_path):
    mark_done(tmp_path, "abc", wall_s=1.0)
    dead = tmp_path / "steps" / f".run-0000.parquet.tmp-{_dead_pid()}"
    live = tmp_path / f".summary.parquet.tmp-{os.getppid()}"  # a running process
    other = tmp_path / ".notes.tmp-draft"  # not a pid: not ours
    for path in (dead, live, other):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"PAR1")
    start_run(tmp_path)
    assert not (tmp_path / DONE_NAME).exists() and not is_done(tmp_path, "abc")
    assert not dead.exists() and live.exists() and other.exists()
    assert remove_stale_temporaries(tmp_path) == []
