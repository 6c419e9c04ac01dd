"""Time the grid's iterations and swaps with the real executor on this machine.

Each iteration point gets a fresh allocator (``naive_oracle`` for block size 1, ``paged``
otherwise) and executor; its sequences are admitted as the scheduler would admit them, and
``RealExecutor.run`` is timed on the batch: the forward alone, where ``run_real`` times an
iteration from the end of the one before, so a replay's steps also hold the engine's scheduling
and bookkeeping (about 0.4 ms a step on a CPU; ``experiment=sim_to_real``'s interleaved grid is
served through ``run_real`` for that reason). ``task=profile`` times its grid in rounds
(``time_grid``): each round times every point once (the first round after an untimed run), in a
shuffled order of its own, and a point's time is its median over the rounds, with the spread
(max - min) / median.
A wake-up point sleeps its ``wait_s`` before each timed run, as ``run_real`` sleeps for an
arrival.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from kvbench.allocators import make_allocator
from kvbench.allocators.base import Allocator
from kvbench.engine.cost_model import IterationShape
from kvbench.engine.scheduler import Batch, Scheduler, SchedulerLimits
from kvbench.engine.sequence import Sequence
from kvbench.executors.forward import model_kv_shape
from kvbench.executors.kv_memory import KVMemory, kv_storage_dtype
from kvbench.executors.real import RealExecutor
from kvbench.tasks.profile.grid import (
    OUTPUT_TOKENS,
    IterationPoint,
    SwapPoint,
    point_sequences,
    point_shape,
)

Point = TypeVar("Point")
Measured = TypeVar("Measured")


@dataclass(frozen=True)
class Timing:
    """A point's median seconds over its timed runs and their spread ((max - min) / median)."""

    median_s: float
    spread: float

    @classmethod
    def of(cls, durations_s: SequenceOf[float]) -> Timing:
        """The median and spread of ``durations_s`` (seconds, at least one)."""
        median_s = statistics.median(durations_s)
        return cls(median_s, (max(durations_s) - min(durations_s)) / median_s)


def timed_runs(
    run: Callable[[], None],
    prepare: Callable[[], None],
    repeats: int,
    before_timed: Callable[[], None] = lambda: None,
    untimed_first: bool = True,
) -> list[float]:
    """Seconds of ``repeats`` runs: ``prepare(); run()`` once untimed (if ``untimed_first``),
    then ``repeats`` times with ``before_timed()`` after ``prepare()`` and ``run`` timed (to the
    end of its GPU work, where it queued some: a swap's copies return before they are done)."""
    durations_s = []
    for index in range(0 if untimed_first else 1, repeats + 1):
        prepare()
        if index:
            before_timed()
        _synchronize()
        started_s = time.perf_counter()
        run()
        _synchronize()
        if index:
            durations_s.append(time.perf_counter() - started_s)
    return durations_s


def _synchronize() -> None:
    """Wait for the GPU's queued work, if torch has started one."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def in_rounds(
    points: SequenceOf[Point],
    measure: Callable[[Point], Measured],
    num_rounds: int,
    seed: int = 0,
    progress: bool = False,
) -> list[list[Measured]]:
    """``measure`` of every point in each of ``num_rounds`` rounds, each round in a shuffled
    order of its own (``seed``: the same orders every run); per point (in the points' order), its
    results round by round.

    Why shuffled: the machine's speed drifts over the minutes a profile takes (on this
    project's shared CPU, paper_executed's probes of a decode step read 0.99-1.38 of a profile's
    price over one afternoon, and moved 0.2 within ten minutes), and in the grid's order, batch
    after batch, a drift would be fitted as a cost of the batches timed meanwhile; shuffled, it
    is noise that every term shares. Why rounds: a slow spell of the machine lasts longer than
    a point's runs (on the AMD EPYC of 2026-12-07, four profiles timed back to back had fit
    residuals correlated by 0.25-0.53 between points timed one after the other), so runs timed
    back to back share it and their median keeps it; a round later the spell has passed, and the
    median over rounds drops it (docs/sim_to_real_measured.md, "Profiles timed in rounds")."""
    from tqdm import tqdm

    measured: list[list[Measured]] = [[] for _ in points]
    with tqdm(total=num_rounds * len(points), desc="profile", unit="point",
              disable=not progress) as bar:  # fmt: skip
        for round_index in range(num_rounds):
            order = list(range(len(points)))
            random.Random(seed + round_index).shuffle(order)
            for index in order:
                measured[index].append(measure(points[index]))
                bar.update()
    return measured


def time_iteration(
    model: Any,
    point: IterationPoint,
    repeats: int,
    decode_backend: str,
    kv_dtype: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[IterationShape, Timing]:
    """The point's shape and its time over ``repeats`` runs back to back (``iteration_runs``)."""
    durations_s = iteration_runs(model, point, repeats, decode_backend, kv_dtype, sleep)
    return point_shape(point), Timing.of(durations_s)


def iteration_runs(
    model: Any,
    point: IterationPoint,
    repeats: int,
    decode_backend: str,
    kv_dtype: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    untimed_first: bool = True,
) -> list[float]:
    """The seconds of the point's ``repeats`` timed runs (after an untimed one, if
    ``untimed_first``; each timed one after an idle wait of ``point.wait_s``), the decode kernel
    on ``decode_backend``, K/V stored in ``kv_dtype`` (``model.kv_dtype``)."""
    name = "naive_oracle" if point.block_size == 1 else "paged"
    max_model_len = max((*point.decode_contexts, *point.prefill_prompts)) + OUTPUT_TOKENS + 2
    allocator = make_allocator(name, point.num_slots(OUTPUT_TOKENS), point.block_size,
                               max_model_len)  # fmt: skip
    executor = RealExecutor(model, allocator, decode_backend, kv_dtype)
    # The contexts read K/V as a served model's pools hold them, not zeros (fp8 reads cost more).
    executor.memory.fill_noise()
    executor.warm_up()
    decode, prefill = point_sequences(point)
    scheduler = Scheduler(SchedulerLimits(max_model_len=max_model_len))

    def prepare() -> None:
        for seq in decode + prefill:
            executor.forget(seq.seq_id)
        _readmit(allocator, decode + prefill)
        for seq in decode:
            executor.assume_computed(seq.seq_id, [0] * seq.num_kv_tokens)

    batch = Batch(decode=decode, prefill=prefill)
    return timed_runs(lambda: executor.run(batch, scheduler), prepare, repeats,
                      lambda: sleep(point.wait_s) if point.wait_s else None,
                      untimed_first)  # fmt: skip


def _readmit(allocator: Allocator, seqs: list[Sequence]) -> None:
    """Free the sequences (if held) and admit each with its next token's slot."""
    for seq in seqs:
        with contextlib.suppress(KeyError):  # not admitted yet
            allocator.free(seq.seq_id)
    for seq in seqs:
        if not allocator.admit(seq.seq_id, seq.request, seq.num_kv_tokens + 1):
            raise RuntimeError(f"profile pool too small for sequence {seq.seq_id}")


def swap_runs(
    model: Any,
    point: SwapPoint,
    repeats: int,
    kv_dtype: str | None = None,
    untimed_first: bool = True,
) -> list[float]:
    """Seconds of one direction of a swap, (copy out + copy back) / 2, in each of ``repeats``
    timed runs (after an untimed one, if ``untimed_first``), of K/V stored in ``kv_dtype``
    (``model.kv_dtype``: fp8 copies its bytes as they are)."""
    num_layers, num_kv_heads, head_dim = model_kv_shape(model)
    num_slots = point.num_slots
    memory = KVMemory(num_layers, num_kv_heads, head_dim, num_slots, point.block_size,
                      model.dtype, model.device,
                      kv_dtype=kv_storage_dtype(kv_dtype))  # fmt: skip
    # On the pools' device, as the executor's tables are.
    slots = torch.arange(point.num_tokens, device=model.device)  # [num_tokens], first blocks
    back = torch.arange(num_slots - point.num_tokens, num_slots,
                        device=model.device)  # [num_tokens], other blocks  # fmt: skip

    def swap_out_and_in() -> None:
        memory.swap_out(0, slots)
        memory.swap_in(0, back)

    durations_s = timed_runs(swap_out_and_in, lambda: None, repeats, untimed_first=untimed_first)
    return [seconds / 2 for seconds in durations_s]


def time_grid(
    model: Any,
    points: SequenceOf[IterationPoint],
    swaps: SequenceOf[SwapPoint],
    num_rounds: int,
    decode_backend: str,
    kv_dtype: str | None = None,
    progress: bool = False,
) -> tuple[list[tuple[IterationShape, Timing]], list[Timing]]:
    """Every iteration point and swap timed once in each of ``num_rounds`` rounds
    (``in_rounds``), after an untimed run in the first; per point its shape (``point_shape``) and
    its timing over the rounds, then per swap its timing.

    Why no untimed run after the first round: a point is set up anew each round, but its
    executor's ``warm_up`` already pays what a first run costs more. Timed too, the untimed run
    of each of the cpu grid's 111 points of then took 1.004x, 1.004x and 1.003x the timed run
    after it (median) in rounds 1, 2 and 3, slower in 58, 58 and 59 of them (the AMD EPYC,
    2026-12-07)."""
    warmed: set[IterationPoint | SwapPoint] = set()

    def measure_once(point: IterationPoint | SwapPoint) -> list[float]:
        untimed_first = point not in warmed
        warmed.add(point)
        if isinstance(point, SwapPoint):
            return swap_runs(model, point, 1, kv_dtype, untimed_first)
        return iteration_runs(model, point, 1, decode_backend, kv_dtype,
                              untimed_first=untimed_first)  # fmt: skip

    timed_points: list[IterationPoint | SwapPoint] = [*points, *swaps]
    measured = in_rounds(timed_points, measure_once, num_rounds, progress=progress)
    timings = [Timing.of([seconds for runs in rounds for seconds in runs]) for rounds in measured]
    shapes = [point_shape(point) for point in points]
    return list(zip(shapes, timings[: len(points)], strict=True)), timings[len(points) :]
