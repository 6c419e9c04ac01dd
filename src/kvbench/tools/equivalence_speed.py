"""``python -m kvbench.tools.equivalence_speed``: what batching bought ``logit_equivalence``.

The experiment decodes every sample through transformers' stock cache (the reference), then
through each allocator's pools with each backend. It used to run every part one sequence at a
time; now every part runs all samples at once: the stock cache and ``gather`` in one padded batch
(``tasks/equivalence/padded.py``), the kernel backends through the real executor's batched
forward (``tasks/equivalence/batched.py``). This tool times both loops in one process, in rounds:
per loop the stock cache, and per allocator the ``torch`` backend and ``gather``; then prints the
medians, each part's speed-up and the experiment's passes summed both ways. Each pass is judged
against its own loop's stock cache by the experiment's own verdict (``table.verdicts``: every
step's ``max_rel_diff`` within the fp32 tolerance, every continuation identical), and the
batched stock cache against the one-by-one one, so the figures come with the criterion they met.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from kvbench.tasks.equivalence.cases import PromptCase, Trajectory
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import ALLOCATORS, MODEL_NAMES, SMOLLM2
from kvbench.tasks.equivalence.padded import StockMemory, padded_trajectories
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.run import backend_trajectories, build_cases
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.table import (
    EQUIVALENCE_COLUMNS,
    Verdict,
    comparison_rows,
    verdicts,
)
from kvbench.tasks.equivalence.trajectories import (
    SampleKey,
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
    stock_trajectories,
)
from kvbench.tasks.profile.profile_file import device_name
from kvbench.tools import count_at_least
from kvbench.workloads.schema import TokenizerUnavailableError

ONE_BY_ONE, BATCHED = "one by one", "batched"
STOCK = "stock"
# The passes of each allocator, by their experiment backend.
BACKENDS = ("torch", "gather")
Trajectories = dict[SampleKey, Trajectory]


def stock_pass(loop: str, model: Any, cases: Sequence[PromptCase], steps: int) -> Trajectories:
    """The stock cache, one sequence at a time (``StockRunner``) or in one padded batch."""
    if loop == ONE_BY_ONE:
        return stock_trajectories(StockRunner(model), cases, steps)
    return padded_trajectories(model, StockMemory(model), cases, steps)


def backend_pass(loop: str, backend: str, model: Any, allocator: str,
                 cases: Sequence[PromptCase], steps: int, block_size: int, seed: int,
                 stock: Trajectories) -> Trajectories:  # fmt: skip
    """``backend`` over ``allocator``'s pools, teacher-forced on ``stock``: one sequence at a
    time (``PagedRunner``, the loop before batching), or the experiment's own pass
    (``run.backend_trajectories``)."""
    if loop == BATCHED:
        return backend_trajectories(model, allocator, backend, list(cases), steps, block_size,
                                    seed, stock)  # fmt: skip
    mode = "gather" if backend == "gather" else "paged"
    runner = PagedRunner(model, allocator, blocks_needed(cases, steps, block_size), block_size,
                         mode, "torch")  # fmt: skip
    scramble_free_blocks(runner.allocator, seed)
    return paged_trajectories(runner, cases, steps, stock)


def judged(paged: Trajectories, stock: Trajectories) -> Verdict:
    """The experiment's verdict of ``paged`` against ``stock``: its table rows
    (``table.comparison_rows``) judged by ``table.verdicts`` (every step within the fp32
    tolerance, every continuation identical)."""
    labels = {"model": "", "allocator": "", "backend": "", "dtype": "fp32", "kv_dtype": "fp32",
              "kv_scales": "unit"}  # fmt: skip
    rows = pd.DataFrame(comparison_rows(labels, paged, stock), columns=list(EQUIVALENCE_COLUMNS))
    return verdicts(rows)[0]


def time_passes(model: Any, cases: Sequence[PromptCase], steps: int, block_size: int,
                allocators: Sequence[str], rounds: int, seed: int = 0,
                on_pass: Callable[[int, str, float], None] | None = None,
                ) -> tuple[dict[str, list[float]], dict[str, Verdict]]:  # fmt: skip
    """Seconds of every part in each of ``rounds`` rounds, keyed ``"{loop}: stock"`` and
    ``"{loop}: {allocator} {backend}"``; and, keyed alike, each part's ``judged`` verdict in the
    first round (a backend's from its loop's stock cache, the batched stock cache's from the
    one-by-one one). ``on_pass(round, key, seconds)`` is called after each part."""
    times_s: dict[str, list[float]] = {}
    judgements: dict[str, Verdict] = {}

    def timed(round_index: int, key: str, run: Callable[..., Trajectories],
              *args: Any) -> Trajectories:  # fmt: skip
        started_s = time.perf_counter()
        trajectories = run(*args)
        seconds = time.perf_counter() - started_s
        times_s.setdefault(key, []).append(seconds)
        if on_pass is not None:
            on_pass(round_index, key, seconds)
        return trajectories

    for round_index in range(rounds):
        stocks = {}
        for loop in (ONE_BY_ONE, BATCHED):
            stock = timed(round_index, f"{loop}: {STOCK}", stock_pass, loop, model, cases, steps)
            stocks[loop] = stock
            for allocator in allocators:
                for backend in BACKENDS:
                    key = f"{loop}: {allocator} {backend}"
                    paged = timed(round_index, key, backend_pass, loop, backend, model,
                                  allocator, cases, steps, block_size, seed, stock)  # fmt: skip
                    if round_index == 0:
                        judgements[key] = judged(paged, stock)
        if round_index == 0:
            judgements[f"{BATCHED}: {STOCK}"] = judged(stocks[BATCHED], stocks[ONE_BY_ONE])
    return times_s, judgements


def summary_lines(times_s: dict[str, list[float]], allocators: Sequence[str]) -> list[str]:
    """The medians over rounds: each part one by one and batched, and the experiment's passes
    (the stock cache + each allocator's torch and gather) summed both ways."""
    median = {key: statistics.median(values) for key, values in times_s.items()}
    parts = [STOCK] + [f"{allocator} {backend}" for allocator in allocators
                       for backend in BACKENDS]  # fmt: skip
    lines = []
    for part in parts:
        before, after = median[f"{ONE_BY_ONE}: {part}"], median[f"{BATCHED}: {part}"]
        lines.append(f"{part}: one by one {before:.1f} s, batched {after:.1f} s "
                     f"({before / after:.1f}x)")  # fmt: skip
    before = sum(median[f"{ONE_BY_ONE}: {part}"] for part in parts)
    after = sum(median[f"{BATCHED}: {part}"] for part in parts)
    lines.append(f"the experiment's passes (stock, torch and gather per allocator): "
                 f"{before:.1f} s one by one, {after:.1f} s batched ({before / after:.1f}x)")
    return lines


def criterion_lines(judgements: dict[str, Verdict]) -> list[str]:
    """Per part, against its reference (``time_passes``): its largest ``max_rel_diff``, whether
    every continuation is identical, the experiment's PASS or FAIL, and whether it was
    bit-identical."""
    def line(key: str, verdict: Verdict) -> str:
        reference = ("the one-by-one stock cache" if key == f"{BATCHED}: {STOCK}"
                     else "its stock cache")  # fmt: skip
        exact = ", bit-identical" if verdict.max_abs_diff == 0 else ""
        return (f"{key}: max_rel_diff {verdict.max_rel_diff:.1e}, continuations "
                f"{'identical' if verdict.tokens_equal else 'DIFFER'}, against {reference} "
                f"({'PASS' if verdict.passed else 'FAIL'}{exact})")

    return [line(key, verdict) for key, verdict in judgements.items()]


def main(argv: list[str] | None = None) -> int:
    """Time the parts in rounds; print each, the medians and the pass criterion."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.equivalence_speed",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--model", choices=MODEL_NAMES, default=SMOLLM2)
    parser.add_argument("--prompts", type=count_at_least(1), default=8,
                        help="prompts (the experiment's 8)")
    parser.add_argument("--samples", type=count_at_least(1), default=2,
                        help="samples per prompt")
    parser.add_argument("--steps", type=count_at_least(1), default=64,
                        help="decode steps per sample")
    parser.add_argument("--block-size", type=count_at_least(1), default=8,
                        help="tokens per block")
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    parser.add_argument("--rounds", type=count_at_least(1), default=2,
                        help="rounds timing every part")
    parser.add_argument("--threads", type=count_at_least(1), default=2, help="torch threads")
    args = parser.parse_args(argv)
    if args.block_size & (args.block_size - 1):  # the paged runner's check, before the timing
        parser.error(f"--block-size {args.block_size}: must be a power of two")
    torch.set_num_threads(args.threads)
    try:
        model = load_model(args.model)
        cases = build_cases(args.model, model, args.prompts, args.samples, seed=0)
    except TokenizerUnavailableError as error:  # SmolLM2's offline weights are not installed
        print(f"kvbench.tools.equivalence_speed: {error}", file=sys.stderr)
        return 3
    print(f"{device_name()}, {args.threads} threads, {args.model}: {args.prompts} prompts x "
          f"{args.samples} samples x {args.steps} steps, block size {args.block_size}, "
          f"{args.rounds} rounds", flush=True)  # fmt: skip
    times_s, judgements = time_passes(
        model, cases, args.steps, args.block_size, args.allocators, args.rounds,
        on_pass=lambda index, key, seconds: print(f"round {index}: {key} {seconds:.1f} s",
                                                  flush=True),
    )  # fmt: skip
    criteria = criterion_lines(judgements)
    print("\n".join(summary_lines(times_s, args.allocators) + criteria))
    return 0


if __name__ == "__main__":
    sys.exit(main())
