"""``python -m kvbench.tools.equivalence_speed``: what batching bought ``logit_equivalence``.

The experiment decodes every sample through transformers' stock cache (the reference), then
through each allocator's pools with each backend. The kernel backends' pass ran one sequence at a
time until it went through the real executor's batched forward (``tasks/equivalence/batched.py``);
``gather`` still runs one at a time, as the stock cache does, since its check is bit-identity and
a batched matmul rounds differently. This tool times each part in one process, in rounds: the
stock cache, and per allocator the ``torch`` backend one sequence at a time (``PagedRunner``, the
loop before) and batched (the loop now), and ``gather``; then prints the medians, the batched
pass's speed-up and the whole experiment's passes summed both ways (with the backends both loops
have: ``torch`` and ``gather``). Each pass is compared with the stock cache as the experiment
compares it (``compare.step_diffs``), so the figures come with the criterion they met.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvbench.tasks.equivalence.cases import PromptCase, Trajectory
from kvbench.tasks.equivalence.compare import step_diffs
from kvbench.tasks.equivalence.models import load_model
from kvbench.tasks.equivalence.names import ALLOCATORS, FP32_REL_TOLERANCE, MODEL_NAMES, SMOLLM2
from kvbench.tasks.equivalence.paged_runner import PagedRunner
from kvbench.tasks.equivalence.run import backend_trajectories, build_cases
from kvbench.tasks.equivalence.stock_runner import StockRunner
from kvbench.tasks.equivalence.trajectories import (
    SampleKey,
    blocks_needed,
    paged_trajectories,
    scramble_free_blocks,
    stock_trajectories,
)
from kvbench.tasks.profile.profile_file import device_name
from kvbench.workloads.schema import TokenizerUnavailableError

STOCK = "stock"
# Each pass, and the experiment's backend that runs it (None: the loop before batching).
PASSES = {"torch one by one": None, "torch batched": "torch", "gather": "gather"}


def run_pass(name: str, model: Any, allocator: str, cases: Sequence[PromptCase], steps: int,
             block_size: int, seed: int, stock: dict[SampleKey, Trajectory],
             ) -> dict[SampleKey, Trajectory]:  # fmt: skip
    """One of ``PASSES`` over ``allocator``'s pools, teacher-forced on ``stock``: ``torch one by
    one`` (``PagedRunner``, the loop before batching), or the experiment's own pass of the
    ``torch`` (batched) or ``gather`` backend (``run.backend_trajectories``)."""
    backend = PASSES[name]
    if backend is not None:
        return backend_trajectories(model, allocator, backend, list(cases), steps, block_size,
                                    seed, stock)  # fmt: skip
    runner = PagedRunner(model, allocator, blocks_needed(cases, steps, block_size), block_size,
                         "paged", "torch")  # fmt: skip
    scramble_free_blocks(runner, seed)
    return paged_trajectories(runner, cases, steps, stock)


def worst_rel_diff(paged: dict[SampleKey, Trajectory], stock: dict[SampleKey, Trajectory]) -> float:
    """The largest ``max_rel_diff`` of any step of any sample (``compare.step_diffs``)."""
    return max(diff.max_rel_diff for key in stock for diff in step_diffs(paged[key], stock[key]))


def time_passes(model: Any, cases: Sequence[PromptCase], steps: int, block_size: int,
                allocators: Sequence[str], rounds: int, seed: int = 0,
                on_pass: Callable[[int, str, float], None] | None = None,
                ) -> tuple[dict[str, list[float]], dict[str, float]]:  # fmt: skip
    """Seconds of every part in each of ``rounds`` rounds, keyed ``stock`` and
    ``"{allocator} {pass}"``; and, keyed alike, each pass's ``worst_rel_diff`` from the stock
    cache in the first round. ``on_pass(round, key, seconds)`` is called after each part."""
    times_s: dict[str, list[float]] = {}
    rel_diffs: dict[str, float] = {}

    def record(round_index: int, key: str, seconds: float) -> None:
        times_s.setdefault(key, []).append(seconds)
        if on_pass is not None:
            on_pass(round_index, key, seconds)

    for round_index in range(rounds):
        started_s = time.perf_counter()
        stock = stock_trajectories(StockRunner(model), cases, steps)
        record(round_index, STOCK, time.perf_counter() - started_s)
        for allocator in allocators:
            for name in PASSES:
                started_s = time.perf_counter()
                trajectories = run_pass(name, model, allocator, cases, steps, block_size, seed,
                                        stock)  # fmt: skip
                seconds = time.perf_counter() - started_s
                record(round_index, f"{allocator} {name}", seconds)
                if round_index == 0:
                    rel_diffs[f"{allocator} {name}"] = worst_rel_diff(trajectories, stock)
    return times_s, rel_diffs


def summary_lines(times_s: dict[str, list[float]], allocators: Sequence[str]) -> list[str]:
    """The medians over rounds: the batched pass's speed-up per allocator, and the passes
    of the whole experiment (stock + each allocator's torch and gather) summed both ways."""
    median = {key: statistics.median(values) for key, values in times_s.items()}
    lines = []
    for allocator in allocators:
        before = median[f"{allocator} torch one by one"]
        after, gather = median[f"{allocator} torch batched"], median[f"{allocator} gather"]
        lines.append(f"{allocator}: torch one by one {before:.1f} s, batched {after:.1f} s "
                     f"({before / after:.1f}x); gather {gather:.1f} s")  # fmt: skip
    common = median[STOCK] + sum(median[f"{allocator} gather"] for allocator in allocators)
    before = common + sum(median[f"{allocator} torch one by one"] for allocator in allocators)
    after = common + sum(median[f"{allocator} torch batched"] for allocator in allocators)
    lines.append(f"the experiment's passes (stock {median[STOCK]:.1f} s, torch and gather per "
                 f"allocator): {before:.1f} s one by one, {after:.1f} s batched "
                 f"({before / after:.1f}x)")  # fmt: skip
    return lines


def criterion_lines(rel_diffs: dict[str, float], tolerance: float) -> list[str]:
    """Per pass: its largest ``max_rel_diff`` from the stock cache, and whether every step met
    ``tolerance`` (the experiment's fp32 criterion), or was bit-identical."""
    def verdict(value: float) -> str:
        passed = "PASS" if value <= tolerance else "FAIL"
        return f"{passed}, bit-identical" if value == 0.0 else passed

    return [f"{key}: max_rel_diff {value:.1e} from the stock cache ({verdict(value)})"
            for key, value in rel_diffs.items()]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Time the parts in rounds; print each, the medians and the pass criterion."""
    parser = argparse.ArgumentParser(prog="python -m kvbench.tools.equivalence_speed",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--model", choices=MODEL_NAMES, default=SMOLLM2)
    parser.add_argument("--prompts", type=int, default=8, help="prompts (the experiment's 8)")
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per sample")
    parser.add_argument("--block-size", type=int, default=8, help="tokens per block")
    parser.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds timing every part")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    if min(args.prompts, args.samples, args.steps, args.block_size, args.rounds) < 1:
        parser.error("--prompts, --samples, --steps, --block-size and --rounds must be >= 1")
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
    times_s, rel_diffs = time_passes(
        model, cases, args.steps, args.block_size, args.allocators, args.rounds,
        on_pass=lambda index, key, seconds: print(f"round {index}: {key} {seconds:.1f} s",
                                                  flush=True),
    )  # fmt: skip
    criteria = criterion_lines(rel_diffs, FP32_REL_TOLERANCE)
    print("\n".join(summary_lines(times_s, args.allocators) + criteria))
    return 0


if __name__ == "__main__":
    sys.exit(main())
