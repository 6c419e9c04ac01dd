"""Charts drawn in worker processes (``tasks.simulate.chart_processes``) are the charts drawn in
the main process, their errors reach the main process, and without workers the charts are drawn
after the tables."""

from __future__ import annotations

import atexit
import importlib
import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import compose_config

from kvbench.cli import _task
from kvbench.tasks.simulate import chart_processes
from kvbench.tasks.simulate.chart_processes import ChartDrawer
from kvbench.tasks.simulate.chart_processes import chart_processes as processes
from kvbench.tasks.simulate.run import run_study

# Two rates, two allocators: every run chart and the rate sweep's.
OVERRIDES = ("experiment=sharegpt_70b", "~schedulers", "workload.num_requests=40",
             "request_rates=[1,6]", "allocators=[naive_max,paged]", "progress=false",
             "summary_table=false")  # fmt: skip


def _charts(folder: Path) -> dict[str, int]:
    """Each PNG below ``folder`` (relative name) and its size in pixels, width x height."""
    return {str(path.relative_to(folder)): int.from_bytes(path.read_bytes()[16:24], "big")
            for path in sorted(folder.rglob("*.png"))}  # fmt: skip


def _study(out: Path, num_workers: int) -> list[int]:
    """Run the study with ``num_workers`` chart workers; the workers each drawer started."""
    started: list[int] = []
    original = ChartDrawer.wait

    def wait(self: ChartDrawer) -> None:
        pool = self._started_pool()
        started.append(0 if pool is None else self._num_processes)
        original(self)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(ChartDrawer, "wait", wait)
        cfg, deployment, raw = compose_config(*OVERRIDES)
        run_study(cfg, deployment, raw, out, num_chart_workers=num_workers)
    return started


def test_worker_processes_draw_the_same_charts_as_the_main_process(tmp_path):
    here = _study(tmp_path / "here", 0)
    workers = _study(tmp_path / "workers", 2)
    assert set(here) == {0} and set(workers) == {2}
    drawn_here = _charts(tmp_path / "here")
    assert {"plots/headline.png", "plots/memory_over_time.png",
            "plots/latency_vs_rate.png"} <= set(drawn_here)  # fmt: skip
    assert _charts(tmp_path / "workers") == drawn_here
    # The report, written after the charts, lists every one of them.
    report = (tmp_path / "workers" / "report.md").read_text()
    assert all(name in report for name in drawn_here)


def _failing_chart(out_dir: Path) -> None:
    raise OSError(28, "No space left on device", str(out_dir / "chart.png"))


def test_a_chart_failing_in_a_worker_raises_its_error_in_the_main_process(tmp_path):
    with pytest.raises(OSError, match="No space left on device") as error, processes(2) as charts:
        charts.draw(f"{__name__}._failing_chart", tmp_path)
    assert error.value.filename == str(tmp_path / "chart.png")


def test_charts_without_workers_wait_for_the_tables_in_this_process(tmp_path):
    with processes(0) as charts:
        charts.draw(f"{__name__}._failing_chart", tmp_path)  # kept, not drawn yet
        assert charts._started_pool() is None
        with pytest.raises(OSError, match="No space left"):
            charts.wait()  # drawn here, now


def test_the_command_line_draws_in_workers_and_a_caller_of_run_study_does_not(monkeypatch):
    monkeypatch.setattr(chart_processes, "num_chart_processes", lambda: 3)
    task = _task("simulate")
    assert task.func is run_study and task.keywords == {"num_chart_workers": 3}
    assert inspect.signature(run_study).parameters["num_chart_workers"].default == 0


def _has_module(name: str) -> bool:
    return name in sys.modules


def test_workers_start_with_the_chart_modules_imported_by_their_fork_server():
    # A fresh interpreter: a fork server already running in this one would have no preload.
    program = (
        "from kvbench.tasks.simulate.chart_processes import ChartDrawer\n"
        "from test_chart_processes import _has_module\n"
        "if __name__ == '__main__':\n"
        "    charts = ChartDrawer(1)\n"
        "    pool = charts._started_pool()\n"
        "    print(pool.submit(_has_module, 'matplotlib.pyplot').result(),\n"
        "          pool.submit(_has_module, 'kvbench.plots.kv_budget_chart').result(),\n"
        "          pool.submit(_has_module, 'kvbench.tasks.simulate.chart_server').result())\n"
        "    charts.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=Path(__file__).parent, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The server imported its quick exit too (``chart_server``), which the workers inherit.
    assert done.stdout.split() == ["True", "True", "True"]


def test_workers_of_a_killed_main_process_exit_and_release_its_output():
    # Killed, the main process cannot stop its workers: they must notice and exit, else they and
    # the fork server keep its stdout open (a caller reading it to the end waits for ever).
    program = (
        "import os, signal\n"
        "from kvbench.tasks.simulate.chart_processes import ChartDrawer\n"
        "if __name__ == '__main__':\n"
        "    pool = ChartDrawer(2)._started_pool()\n"
        "    print(*[process.pid for process in pool._processes.values()], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr
    worker_pids = [int(pid) for pid in done.stdout.split()]
    assert len(worker_pids) == 2
    deadline_s = time.monotonic() + 10
    while time.monotonic() < deadline_s and any(_running(pid) for pid in worker_pids):
        time.sleep(0.1)
    assert not any(_running(pid) for pid in worker_pids)


def _running(pid: int) -> bool:
    """Whether the process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_quick_exit_of_the_fork_server_is_not_taken_by_another_process():
    before = atexit._ncallbacks()
    try:
        importlib.reload(importlib.import_module("kvbench.tasks.simulate.chart_server"))
        assert atexit._ncallbacks() == before
    finally:  # were it registered here, pytest would end with status 0 whatever failed
        atexit.unregister(os._exit)
