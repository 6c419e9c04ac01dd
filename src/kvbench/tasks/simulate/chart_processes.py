"""Where a study's charts are drawn: in this process, or in worker processes beside the tables.

Drawing a run's charts costs seconds of CPU (laying out text and rendering PNGs), all of it after
the last simulation, when the main process also builds and writes its tables. A study run from
the command line (``num_chart_processes()`` workers) starts its workers as it starts: their
start (importing matplotlib and the chart modules, about a CPU-second) overlaps the simulations,
and each chart is then drawn in a worker while the main process writes its tables. A study
without workers (a script calling ``run_study``, a test, one CPU) draws in the main process,
after its tables. The files are the same either way.

The workers come from a fork server (``multiprocessing``'s ``forkserver``): a clean process
forks each worker, so nothing of the main process's state (its threads, its memory) is copied
into them. The server imports the chart modules (matplotlib among them) once, before it forks,
so every worker starts with them imported: one import, not one per worker. The pool is started
from a thread of its own, which waits for the server while this process goes on simulating.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextvars import ContextVar
from typing import Any

from kvbench.plots import chart_formats, saved_formats

# What the fork server imports before it forks the workers: the modules of every chart
# ``tasks.simulate.plot`` names.
_CHART_MODULES = [
    "kvbench.tasks.simulate.plot",
    "kvbench.plots.headline_chart",
    "kvbench.plots.run_charts",
    "kvbench.plots.kv_budget_chart",
    "kvbench.plots.sweep_charts",
    "kvbench.plots.capacity_chart",
    "kvbench.plots.scheduler_chart",
]


def num_chart_processes() -> int:
    """Workers for the charts: up to three, none on a machine with a single CPU for this
    process (there the main process draws)."""
    num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return 0 if num_cpus < 2 else min(3, num_cpus)


@contextlib.contextmanager
def _collector_skips_what_exists() -> Iterator[None]:
    """Drawing allocates many small objects, each batch of which wakes the cyclic garbage
    collector; everything alive before the chart (a run's records and tables, the imported
    modules) is set aside for the duration so that it does not traverse them all again."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _draw(formats: tuple[str, ...], chart: str, args: tuple[Any, ...]) -> None:
    module, _, function = chart.rpartition(".")
    draw = getattr(importlib.import_module(module), function)
    with chart_formats(formats), _collector_skips_what_exists():
        draw(*args)


def _exit_with_the_main_process() -> None:
    """Each worker's initializer: a worker whose main process has died (killed: it could not
    stop its workers) exits too. Otherwise it would wait for charts for ever (its task queue's
    pipe is open in the worker itself), and keep the fork server and the command's output open."""
    main_process = multiprocessing.parent_process()
    if main_process is not None:
        threading.Thread(target=_exit_when_ready, args=(main_process.sentinel,), daemon=True,
                         name="kvbench-main-process-watch").start()  # fmt: skip


def _exit_when_ready(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _started() -> None:
    """A no-op task: submitting one per worker starts the workers before any chart is due."""


class ChartDrawer:
    """Hands charts (``draw``) to ``num_processes`` worker processes, started (from a thread)
    as the drawer is made; without workers, keeps them to draw here in ``wait`` (or, with
    ``defer=False``, draws them at once). ``wait`` returns when every chart is written, raising
    the first chart's error (a full disk names its file)."""

    def __init__(self, num_processes: int, defer: bool = True) -> None:
        self._num_processes = num_processes
        self._defer = defer
        self._starter: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._deferred: list[tuple[tuple[str, ...], str, tuple[Any, ...]]] = []
        if num_processes:  # the caller goes on (simulating) while the workers start
            self._starter = threading.Thread(target=self._start_pool, daemon=True,
                                             name="kvbench-chart-processes")  # fmt: skip
            self._starter.start()

    def _start_pool(self) -> None:
        """Start the fork server (it imports the chart modules first) and every worker; an
        error is kept for ``_started_pool`` to raise in the caller's thread."""
        try:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["kvbench.tasks.simulate.chart_server",
                                            *_CHART_MODULES])  # fmt: skip
            pool = ProcessPoolExecutor(self._num_processes, mp_context=context,
                                       initializer=_exit_with_the_main_process)  # fmt: skip
            self._pending += [pool.submit(_started) for _ in range(self._num_processes)]
            self._pool = pool
        except BaseException as error:  # raised again where the charts are drawn
            self._start_error = error

    def _started_pool(self) -> ProcessPoolExecutor | None:
        """The workers' pool once its start (if begun) is over; None if none was begun."""
        if self._starter is not None:
            self._starter.join()
            if self._start_error is not None:
                raise self._start_error
        return self._pool

    def draw(self, chart: str, *args: Any) -> None:
        """The chart function ``chart`` (its dotted path, ``module.function``) called with
        ``args`` in the formats of ``kvbench.plots.chart_formats``: here, or in a worker (where
        ``args`` arrive pickled; the function's module is imported only where it draws)."""
        pool = self._started_pool()
        if pool is not None:
            self._pending.append(pool.submit(_draw, saved_formats(), chart, args))
        elif self._defer:  # drawn by ``wait``: after the tables, which a failed chart never costs
            self._deferred.append((saved_formats(), chart, args))
        else:
            _draw(saved_formats(), chart, args)

    def wait(self) -> None:
        """Every chart handed over (or deferred), written; the first error raised here."""
        self._started_pool()
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        deferred, self._deferred = self._deferred, []
        for formats, chart, args in deferred:
            _draw(formats, chart, args)

    def close(self) -> None:
        """Stop the workers (after ``wait``; charts not yet drawn are dropped)."""
        if self._starter is not None:
            self._starter.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


_drawer: ContextVar[ChartDrawer | None] = ContextVar("chart_drawer", default=None)


@contextlib.contextmanager
def chart_processes(num_processes: int) -> Iterator[ChartDrawer]:
    """The drawer of the charts drawn inside the block (``drawer()``), up to ``num_processes``
    workers; on leaving, every chart is written (or its error raised)."""
    drawer = ChartDrawer(num_processes)
    token = _drawer.set(drawer)
    try:
        yield drawer
        drawer.wait()
    finally:
        _drawer.reset(token)
        drawer.close()


def drawer() -> ChartDrawer:
    """The drawer of ``chart_processes``' block; outside one, a drawer that draws at once."""
    return _drawer.get() or ChartDrawer(0, defer=False)
