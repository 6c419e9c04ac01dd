"""Time the grid's iterations and swaps with the real executor on this machine.

Each iteration point gets a fresh allocator (``naive_oracle`` for block size 1, ``paged``
otherwise) and executor; its sequences are admitted as the scheduler would admit them, and
``RealExecutor.run`` is timed on the batch: the forward alone, where ``run_real`` times an
iteration from the end of the one before, so a replay's steps also hold the engine's scheduling
and bookkeeping (about 0.4 ms a step on a CPU; ``experiment=sim_to_real``'s interleaved grid is
served through ``run_real`` for that reason). A point runs once
untimed, then ``repeats`` times; the median is kept, with the spread (max - min) / median. A
wake-up point sleeps its ``wait_s`` before each run, as ``run_real`` sleeps for an arrival.
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
from kvbench.engine.cost_model import IterationShape, iteration_shape
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
)

Point = TypeVar("Point")
Measured = TypeVar("Measured")


@dataclass(frozen=True)
class Timing:
    """A point's median seconds over its repeats and their spread ((max - min) / median)."""

    median_s: float
    spread: float


def time_repeats(run: Callable[[], None], prepare: Callable[[], None], repeats: int) -> Timing:
    """``prepare(); run()`` once untimed, then ``repeats`` times with ``run`` timed (to the end
    of its GPU work, where it queued some: a swap's copies return before they are done)."""
    durations = []
    for index in range(repeats + 1):
        prepare()
        _synchronize()
        started_s = time.perf_counter()
        run()
        _synchronize()
        if index:
            durations.append(time.perf_counter() - started_s)
    median_s = statistics.median(durations)
    return Timing(median_s, (max(durations) - min(durations)) / median_s)


def _synchronize() -> None:
    """Wait for the GPU's queued work, if torch has started one."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def in_shuffled_order(
    points: SequenceOf[Point], measure: Callable[[Point], Measured], seed: int = 0
) -> list[Measured]:
    """``measure`` of every point, called in a shuffled order (``seed``: the same order every
    run), the results in the points' order. The machine's speed drifts over the minutes a
    profile takes (on this project's shared CPU, paper_executed's probes of a decode step read
    0.99-1.38 of a profile's price over one afternoon, and moved 0.2 within ten minutes), and in
    the grid's order, batch after batch, a drift would be fitted as a cost of the batches timed
    meanwhile; shuffled, it is noise that every term shares."""
    order = list(range(len(points)))
    random.Random(seed).shuffle(order)
    measured = {index: measure(points[index]) for index in order}
    return [measured[index] for index in range(len(points))]


def time_iteration(
    model: Any,
    point: IterationPoint,
    repeats: int,
    decode_backend: str,
    kv_dtype: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[IterationShape, Timing]:
    """The point's shape and its measured time (after an idle wait of ``point.wait_s``), the
    decode kernel on ``decode_backend``, K/V stored in ``kv_dtype`` (``model.kv_dtype``)."""
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
        if point.wait_s:
            sleep(point.wait_s)

    batch = Batch(decode=decode, prefill=prefill)
    timing = time_repeats(lambda: executor.run(batch, scheduler), prepare, repeats)
    context = sum(seq.num_kv_tokens for seq in decode)
    return iteration_shape(prefill, len(decode), context), timing


def _readmit(allocator: Allocator, seqs: list[Sequence]) -> None:
    """Free the sequences (if held) and admit each with its next token's slot."""
    for seq in seqs:
        with contextlib.suppress(KeyError):  # not admitted yet
            allocator.free(seq.seq_id)
    for seq in seqs:
        if not allocator.admit(seq.seq_id, seq.request, seq.num_kv_tokens + 1):
            raise RuntimeError(f"profile pool too small for sequence {seq.seq_id}")


def time_swap(model: Any, point: SwapPoint, repeats: int, kv_dtype: str | None = None) -> Timing:
    """Seconds of one direction of a swap: (copy out + copy back) / 2, of K/V stored in
    ``kv_dtype`` (``model.kv_dtype``: fp8 copies its bytes as they are)."""
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

    timing = time_repeats(swap_out_and_in, lambda: None, repeats)
    return Timing(timing.median_s / 2, timing.spread)
