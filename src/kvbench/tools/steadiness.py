"""``python -m kvbench.tools.steadiness``: how steadily this machine repeats the same work.

A profile prices an iteration by its shape, so it cannot price a step closer than the machine
repeats that step; and a request's latency sums its steps, so noise that lasts from one step to
the next sums into its error where independent noise would average out. Before profiling on a
machine (or trusting a sim-to-real figure measured on it), time two fixed pieces of work
``--repeats`` times in a row:

- ``python``: a pure-Python loop (the engine's scheduling and bookkeeping run as Python);
- ``matmul``: a chain of fp32 matmuls of SmolLM2's width on 16 rows (a decode step's dense
  layers), on ``--threads`` torch threads.

Each gets its median, its interquartile range over its median (how far apart repeats fall) and
the correlation of each run's time with the next one's (near 0: noise that averages out over a
request's steps; near 1: a speed that wanders and stays, which it sums). docs/sim_to_real.md
gives the figures of the machines this project measured on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbench.tasks.profile.profile_file import device_name
from kvbench.tools import count_at_least

WIDTH = 576  # SmolLM2-135M's hidden size
ROWS = 16  # a decode step of 16 sequences


@dataclass(frozen=True)
class Steadiness:
    """How a run of the same work repeated.

    Attributes:
        median_ms: the median run's milliseconds.
        iqr_pct: (third quartile - first quartile) / median x 100.
        min_ms, max_ms: the quickest and slowest runs.
        lag1_correlation: Pearson correlation of each run's time with the next run's.
    """

    median_ms: float
    iqr_pct: float
    min_ms: float
    max_ms: float
    lag1_correlation: float


def steadiness(times_s: list[float]) -> Steadiness:
    """The figures of ``times_s`` (at least 4 runs, in the order they ran)."""
    if len(times_s) < 4:
        raise ValueError(f"{len(times_s)} runs: steadiness needs at least 4")
    times_ms = [t * 1e3 for t in times_s]
    median_ms = statistics.median(times_ms)
    first, _, third = statistics.quantiles(times_ms, n=4)
    spread = statistics.pstdev(times_ms)
    lag1 = statistics.correlation(times_ms[:-1], times_ms[1:]) if spread > 0 else 0.0
    return Steadiness(median_ms, (third - first) / median_ms * 100, min(times_ms),
                      max(times_ms), lag1)  # fmt: skip


def timed_runs(work: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of ``repeats`` runs of ``work`` in a row, after one that warms it up."""
    work()
    times_s = []
    for _ in range(repeats):
        started_s = time.perf_counter()
        work()
        times_s.append(time.perf_counter() - started_s)
    return times_s


def python_loop(num_iterations: int) -> Callable[[], int]:
    """A sum over ``num_iterations`` integers in the interpreter."""

    def work() -> int:
        total = 0
        for value in range(num_iterations):
            total += value
        return total

    return work


def matmul_chain(num_matmuls: int) -> Callable[[], torch.Tensor]:
    """``num_matmuls`` fp32 [ROWS, WIDTH] x [WIDTH, WIDTH] matmuls, each feeding the next."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(WIDTH, WIDTH, generator=generator) / WIDTH**0.5
               for _ in range(num_matmuls)]  # fmt: skip  # each [WIDTH, WIDTH]
    hidden = torch.randn(ROWS, WIDTH, generator=generator)  # [ROWS, WIDTH]

    def work() -> torch.Tensor:
        out = hidden
        for weight in weights:
            out = torch.tanh(out @ weight)  # [ROWS, WIDTH]
        return out

    return work


def line(name: str, figures: Steadiness) -> str:
    """One probe's figures as printed."""
    return (f"{name}: median {figures.median_ms:.1f} ms, interquartile range "
            f"{figures.iqr_pct:.1f} % of it, runs {figures.min_ms:.1f}-{figures.max_ms:.1f} ms, "
            f"correlation with the next run {figures.lag1_correlation:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.steadiness",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=40, help="runs of each probe (>= 4)")
    parser.add_argument("--threads", type=count_at_least(1), default=2,
                        help="torch threads of the matmuls")
    parser.add_argument("--python-iterations", type=count_at_least(1), default=2_000_000)
    parser.add_argument("--matmuls", type=count_at_least(1), default=720,
                        help="matmuls a chain runs")
    args = parser.parse_args(argv)
    if args.repeats < 4:
        parser.error(f"--repeats={args.repeats}: needs at least 4")
    torch.set_num_threads(args.threads)
    print(f"{device_name()}, {args.repeats} runs of each probe in a row:")
    probes = {"python": python_loop(args.python_iterations),
              f"matmul ({args.threads} threads)": matmul_chain(args.matmuls)}  # fmt: skip
    for name, work in probes.items():
        print(line(name, steadiness(timed_runs(work, args.repeats))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
