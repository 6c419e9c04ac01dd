"""Test-only: the points of a write where the fault tests kill the process (SIGKILL).

Every atomic write of ``kvbench.tables`` passes ``kill_point`` at each of its steps (a chunk
appended to a temporary file, the temporary file complete, the file published). Unset, the two
environment variables below make it a no-op (one dictionary look-up per write). The fault tests
(``tests/test_faults.py``) set them on a ``python -m kvbench`` subprocess:

- ``KVBENCH_TEST_WRITE_TRACE=FILE`` appends ``N STEP PATH`` per point passed (N counts from 1), so
  a test learns how many points a run has and what each is;
- ``KVBENCH_TEST_KILL_AT_WRITE=N`` sends SIGKILL to the process itself at the N-th point: the
  process dies there as a power cut or an OOM kill would stop it, without cleaning up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

KILL_AT_ENV = "KVBENCH_TEST_KILL_AT_WRITE"
TRACE_ENV = "KVBENCH_TEST_WRITE_TRACE"

_num_points_passed = 0


def kill_point(path: Path, step: str) -> None:
    """One step of writing ``path``; kills the process here when a fault test asked for it."""
    kill_at = os.environ.get(KILL_AT_ENV)
    trace_path = os.environ.get(TRACE_ENV)
    if not kill_at and not trace_path:
        return
    global _num_points_passed
    _num_points_passed += 1
    if trace_path:
        with open(trace_path, "a") as trace:
            trace.write(f"{_num_points_passed} {step} {path}\n")
    if kill_at and int(kill_at) == _num_points_passed:
        os.kill(os.getpid(), signal.SIGKILL)
