"""Faults while writing: a run killed (SIGKILL) at any point leaves only whole files and a re-run
of the same command repairs the folder; a full disk ends in one line, exit code 4, and the files
written before it survive.

The kills hit real ``python -m kvbench`` processes: at the write points of ``kvbench.tables``
(``KVBENCH_TEST_KILL_AT_WRITE``, see ``kvbench.tables.kill_points``), where a file is complete in
its temporary place but not yet published, and at random delays (seeded), wherever the run is.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench.tables.done_marker import DONE_NAME
from kvbench.tables.kill_points import KILL_AT_ENV, TRACE_ENV
from kvbench.tables.parquet import read_metadata

SEED = 14
# 4 runs (2 allocators x 2 rates) on 200 sampled ShareGPT requests: ~2 s a process, and every
# kind of write: the summary after each run (whole files), the steps and requests of each run
# (streamed: row groups appended to a temporary file), knees, DONE.
RUN = ("workload=sharegpt", "workload.num_requests=200", "model=opt-13b", "hardware=a100-40gb",
       "allocators=[naive_max,paged]", "request_rates=[2,8]", "progress=false")  # fmt: skip
STREAMED = ("engine.stream_tables=true", "plots=false")
KEPT = ("engine.stream_tables=false", "plots=false")
# Columns that measure the machine, not the simulation: they differ between two equal runs.
WALL_CLOCK_COLUMNS = ["simulation_wall_s", "run_dir"]
PNG_END = b"IEND\xaeB`\x82"


def kvbench(out: Path, *overrides: str, env: dict[str, str] | None = None, **popen):
    """``python -m kvbench RUN... OVERRIDES hydra.run.dir=OUT``, run to its end."""
    return subprocess.run(_command(out, overrides), env=_env(env), capture_output=True,
                          text=True, timeout=300, **popen)  # fmt: skip


def _command(out: Path, overrides: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "kvbench", *RUN, *overrides, f"hydra.run.dir={out}"]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in (KILL_AT_ENV, TRACE_ENV)}
    return {**env, **(extra or {})}


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run and the write points it passed: (N, step, path in the folder)."""

    folder: Path
    write_points: list[tuple[int, str, str]]
    wall_s: float


def reference_run(folder: Path, *overrides: str) -> Reference:
    trace = folder.parent / f"{folder.name}.writes"
    started_s = time.perf_counter()
    done = kvbench(folder, *overrides, env={TRACE_ENV: str(trace)})
    wall_s = time.perf_counter() - started_s
    assert done.returncode == 0, done.stderr
    points = []
    for line in trace.read_text().splitlines():
        number, step, path = line.split(" ", 2)
        points.append((int(number), step, str(Path(path).relative_to(folder))))
    return Reference(folder, points, wall_s)


# --- What a folder may hold ---


def _visible_files(folder: Path) -> list[Path]:
    """Files a reader of the folder sees (not Hydra's ``.hydra/``, not hidden temporaries)."""
    relatives = (path.relative_to(folder) for path in folder.rglob("*") if path.is_file())
    return sorted(path for path in relatives if not any(p.startswith(".") for p in path.parts))


def _table(path: Path) -> pd.DataFrame:
    frame = pq.read_table(path).to_pandas()  # reads every row group: a torn file raises here
    return frame.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in frame.columns])


def assert_whole_and_consistent(folder: Path, reference: Reference) -> None:
    """Every file a reader sees is whole, and holds what the uninterrupted run wrote there (the
    tables written after each run: its first rows); a DONE marker means all of it."""
    reference_config = read_metadata(reference.folder / "summary.parquet")["config_yaml"]
    for relative in _visible_files(folder):
        path = folder / relative
        if path.suffix == ".parquet":
            assert read_metadata(path)["config_yaml"] == reference_config, relative
            table, expected = _table(path), _table(reference.folder / relative)
            assert len(table) > 0, f"{relative} has no rows"
            pd.testing.assert_frame_equal(table, expected.head(len(table)), obj=str(relative))
        elif path.suffix == ".png":
            assert path.read_bytes().endswith(PNG_END), f"{relative} is cut short"
        elif path.suffix == ".svg":
            assert path.read_text().rstrip().endswith("</svg>"), f"{relative} is cut short"
    if (folder / DONE_NAME).exists():
        assert_same_result(folder, reference)


def assert_same_result(folder: Path, reference: Reference) -> None:
    """``folder`` holds the uninterrupted run's result: the same files, equal tables, its DONE,
    and no temporary file left."""
    assert _visible_files(folder) == _visible_files(reference.folder)
    for relative in _visible_files(folder):
        if relative.suffix == ".parquet":
            expected = _table(reference.folder / relative)
            pd.testing.assert_frame_equal(_table(folder / relative), expected, obj=str(relative))
    done, expected = (folder / DONE_NAME).read_text(), (reference.folder / DONE_NAME).read_text()
    assert done.split('"wall_s"')[0] == expected.split('"wall_s"')[0]  # the config's fingerprint
    assert not list(folder.rglob(".*.tmp-*")), "temporary files left behind"


# --- Killing a run ---


def kill_at_write(out: Path, point: int, *overrides: str) -> None:
    """Run the command in ``out`` and have it SIGKILL itself at its write point ``point``."""
    done = kvbench(out, *overrides, env={KILL_AT_ENV: str(point)})
    assert done.returncode == -signal.SIGKILL, (point, done.returncode, done.stderr[-2000:])


def kill_after(out: Path, delay_s: float, *overrides: str) -> bool:
    """Start the command in ``out`` and SIGKILL it after ``delay_s``; False if it ended first."""
    process = subprocess.Popen(_command(out, overrides), env=_env(None),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        process.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    return process.returncode == -signal.SIGKILL


def _point(points: list[tuple[int, str, str]], step: str, name: str, occurrence: int = 0) -> int:
    """The number of the ``occurrence``-th (0: first; the last if there are fewer) point ``step``
    of the file ``name``."""
    numbers = [number for number, point_step, point_name in points
               if point_step == step and point_name == name]  # fmt: skip
    return numbers[min(occurrence, len(numbers) - 1)]


def test_a_run_killed_while_writing_leaves_whole_files_and_a_rerun_repairs_it(tmp_path):
    reference = reference_run(tmp_path / "reference", *STREAMED)
    points = reference.write_points
    assert {step for _, step, _ in points} == {"chunk", "written", "published"}
    # Killed with the first run's steps half-written (row groups, no footer yet), with the
    # second run's summary complete in its temporary file, in the third run's steps, with the
    # DONE marker written but not in place; then at a random point and at a random delay.
    rng = random.Random(SEED)
    torn = _point(points, "chunk", "steps/run-0000.parquet")
    chosen = [torn, _point(points, "written", "summary.parquet", occurrence=1),
              _point(points, "chunk", "steps/run-0002.parquet"),
              _point(points, "written", DONE_NAME), rng.choice(points)[0]]  # fmt: skip
    out = tmp_path / "run"
    for point in chosen:
        kill_at_write(out, point, *STREAMED)
        assert_whole_and_consistent(out, reference)
        assert not (out / DONE_NAME).exists() or point == points[-1][0]
        if point == torn:  # the torn file is there, hidden; a reader of steps/ does not see it
            (temporary,) = (out / "steps").glob(".run-0000.parquet.tmp-*")
            with pytest.raises(pa.ArrowInvalid):
                pq.read_table(temporary)
            assert not (out / "steps" / "run-0000.parquet").exists()
    kill_after(out, rng.uniform(0.5, reference.wall_s), *STREAMED)
    assert_whole_and_consistent(out, reference)

    rerun = kvbench(out, *STREAMED)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_result(out, reference)  # no temporary file left either


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["kept", "streamed"])
def test_random_kills_with_plots_and_streamed_tables(tmp_path, stream):
    """Many kills, at every kind of write point and at random delays, with charts drawn and (for
    ``streamed``) the per-run files of ``engine.stream_tables``."""
    overrides = (f"engine.stream_tables={str(stream).lower()}", "plots=true")
    reference = reference_run(tmp_path / "reference", *overrides)
    rng = random.Random(SEED + stream)
    out = tmp_path / "run"
    num_killed = 0
    for attempt in range(24):
        if attempt % 2 == 0:
            kill_at_write(out, rng.choice(reference.write_points)[0], *overrides)
            num_killed += 1
        else:
            num_killed += kill_after(out, rng.uniform(0.3, reference.wall_s), *overrides)
        assert_whole_and_consistent(out, reference)
        if attempt % 6 == 5:  # a re-run repairs the folder whatever the kills left
            rerun = kvbench(out, *overrides)
            assert rerun.returncode == 0, rerun.stderr
            assert_same_result(out, reference)
        # A complete folder (a run the delay did not stop, a repair) would be skipped: start over.
        (out / DONE_NAME).unlink(missing_ok=True)
    assert num_killed >= 18


# --- A full disk ---


def _file_size_limit(num_bytes: int):
    """``preexec_fn`` of a process that may write no file larger than ``num_bytes``: a write past
    it fails with EFBIG (SIGXFSZ ignored), as a full disk fails with ENOSPC."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, num_bytes))

    return limit


def test_a_full_disk_ends_in_one_line_and_keeps_the_earlier_results(tmp_path):
    out = tmp_path / "run"
    first = kvbench(out, "workload.num_requests=20", *KEPT)
    assert first.returncode == 0, first.stderr
    before = {relative: (out / relative).read_bytes() for relative in _visible_files(out)}
    # Room for every file of the 20-request run, not for the steps of the 200-request run
    # (~4.5x the first run's steps table: more requests, more iterations).
    limit_bytes = 2 * len(before[Path("steps.parquet")])

    full = kvbench(out, *KEPT, preexec_fn=_file_size_limit(limit_bytes))
    assert full.returncode == 4, full.stderr
    lines = full.stderr.splitlines()
    assert len(lines) == 1, full.stderr
    assert lines[0].startswith(f"kvbench: file error: {out / 'steps.parquet'}: File too large; ")
    assert "run the same command again" in lines[0]
    assert "hydra.run.dir=DIR" in lines[0]
    # Each file is the first run's, byte for byte, or whole and the second run's (the summary,
    # written after each of its runs); the steps table it could not write is the first run's;
    # the folder is not called complete and holds no temporary file.
    assert (out / "steps.parquet").read_bytes() == before[Path("steps.parquet")]
    replaced = {relative: _table(out / relative) for relative in _visible_files(out)
                if (out / relative).read_bytes() != before.get(relative)}  # fmt: skip
    assert not (out / DONE_NAME).exists()
    assert not list(out.rglob(".*.tmp-*")), "the failed write left its temporary file"

    rerun = kvbench(out, *KEPT)
    assert rerun.returncode == 0, rerun.stderr
    assert (out / DONE_NAME).exists()
    for relative, table in replaced.items():
        expected = _table(out / relative)
        pd.testing.assert_frame_equal(table, expected.head(len(table)), obj=str(relative))
    assert (out / "steps.parquet").stat().st_size > limit_bytes  # what the limit stopped
