"""``kvbench.cli.run``, the console script and ``python -m kvbench``: it ends the process once
``main`` has returned, with its output flushed and its exit handlers run, and returns instead
while another (non-daemon) thread runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OVERRIDES = ["experiment=sharegpt_70b", "~schedulers", "workload.num_requests=20",
             "request_rates=[1]", "allocators=[paged]", "plots=false",
             "progress=false"]  # fmt: skip


def _run(tmp_path: Path, before: str, after: str = "") -> subprocess.CompletedProcess[str]:
    """``run()`` in a fresh interpreter, between ``before`` and a line saying it returned (then
    ``after``)."""
    argv = ["kvbench", *OVERRIDES, f"hydra.run.dir={tmp_path / 'run'}"]
    program = (
        "import atexit, sys, threading\n"
        f"{before}\n"
        f"sys.argv = {argv!r}\n"
        "from kvbench.cli import run\n"
        "run()\n"
        "print('run returned')\n"
        f"{after}\n"
    )
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_run_ends_the_process_with_output_flushed_and_exit_handlers_run(tmp_path):
    marker = tmp_path / "exit_handler_ran"
    done = _run(tmp_path, f"atexit.register(lambda: open({str(marker)!r}, 'w').close())")
    assert done.returncode == 0, done.stderr
    assert "summary.parquet" in done.stdout  # the files list, printed last, reached the pipe
    assert "run returned" not in done.stdout  # the process ended inside run()
    assert marker.exists()
    assert (tmp_path / "run" / "summary.parquet").is_file()


def test_run_returns_while_another_thread_runs(tmp_path):
    done = _run(tmp_path, "stop = threading.Event()\n"
                          "threading.Thread(target=stop.wait, args=(120,)).start()",
                after="stop.set()")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "run returned" in done.stdout
