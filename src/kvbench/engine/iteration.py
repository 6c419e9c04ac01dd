"""What both engine paths do with an iteration they run, in one place: price and record it
(``record_step``, with the wake-up after an idle wait that ``IdleWait`` keeps), then its
sequences' tokens come out, samples fork, finished sequences go (``end_iteration``)."""

from __future__ import annotations

from kvbench.allocators.base import Allocator
from kvbench.engine.cost_model import CostModel, iteration_shape
from kvbench.engine.records import StepRecords
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Batch, Scheduler
from kvbench.engine.sequence import Sequence


class IdleWait:
    """Whether the engine has waited for an arrival with nothing to run since its last
    iteration, and from when: the next iteration it runs pays ``CostModel.wake_time_s`` for it.

    The loops call ``begin`` when they jump (or sleep) to the next arrival, and ``record_step``
    calls ``end`` for every iteration it prices: only the first after the wait is charged."""

    __slots__ = ("since_s",)

    def __init__(self) -> None:
        self.since_s: float | None = None  # when the wait began (None: no wait)

    def begin(self, now_s: float) -> None:
        """The engine has nothing to run from ``now_s`` (a wait already begun goes on)."""
        if self.since_s is None:
            self.since_s = now_s

    def end(self, now_s: float) -> float:
        """Seconds waited before an iteration starting at ``now_s`` (0.0 without a wait)."""
        since_s, self.since_s = self.since_s, None
        return 0.0 if since_s is None else now_s - since_s


def record_step(
    steps: StepRecords,
    batch: Batch,
    now_s: float,
    decode_context_tokens: int,
    scheduler: Scheduler,
    allocator: Allocator,
    cost_model: CostModel,
    idle: IdleWait | None = None,
) -> float:
    """Price the iteration ``batch`` runs from ``now_s`` (slots allocated, queues updated) and
    append its step row; returns its duration (s). ``decode_context_tokens`` is the decode
    sequences' KV tokens in all (the lazy batch keeps the sum: its sequences' counts are stale).
    The first iteration after an idle wait (``idle``) also pays the cost model's wake-up.

    Decode-only stretches of the lazy batch write their rows in bulk instead
    (``StepRecords.decode_row_appenders``): the same columns, without a call per iteration."""
    usage = allocator.usage()
    if batch.memory_blocked:
        usage = usage.with_free_blocked()
    num_decode_tokens = batch.num_decode_tokens
    shape = iteration_shape(batch.prefill, num_decode_tokens, decode_context_tokens)
    duration_s = cost_model.iteration_time_s(shape)
    # Swaps and the CPU tier's prefix loads cross PCIe before the iteration computes.
    swap_tokens = batch.num_swap_in_tokens + batch.num_swap_out_tokens + batch.num_cpu_load_tokens
    if swap_tokens:
        duration_s += cost_model.swap_time_s(swap_tokens)
    idle_s = idle.end(now_s) if idle is not None else 0.0
    if idle_s > 0:
        duration_s += cost_model.wake_time_s(idle_s)
    steps.append(
        time_s=now_s,
        duration_s=duration_s,
        batch_size=batch.num_seqs,
        num_prefill_seqs=len(batch.prefill),
        num_prefill_tokens=shape.num_prefill_tokens,
        num_decode_tokens=num_decode_tokens,
        prefill_attention_pairs=shape.prefill_attention_pairs,
        decode_context_tokens=decode_context_tokens,
        num_waiting=len(scheduler.waiting),
        num_swapped=len(scheduler.swapped),
        num_preempted=batch.num_preempted,
        memory_blocked=batch.memory_blocked,
        usage=usage,
    )
    return duration_s


def finish_sequence(
    seq: Sequence, end_s: float, scheduler: Scheduler, allocator: Allocator,
    samples: SampleGroups,
) -> bool:
    """Record the slots it held at its end, free it, and close its request's record if it was
    the request's last sequence (then True)."""
    seq.record.mark_held_slots(allocator.held_slots(seq.seq_id))
    scheduler.finish(allocator, seq)
    if not samples.finish(seq):
        return False
    seq.record.mark_finished(end_s)
    return True


def end_iteration(
    batch: Batch,
    now_s: float,
    end_s: float,
    scheduler: Scheduler,
    allocator: Allocator,
    samples: SampleGroups,
) -> int:
    """Advance the sequences of ``batch``, which ran from ``now_s`` to ``end_s``, by their token;
    returns how many requests finished."""
    for seq in batch.prefill:
        seq.record.mark_admitted(now_s, seq.num_cached_tokens)
    num_finished = 0
    for seq in batch.sequences:
        seq.num_generated += 1
        if seq.num_generated == 1:
            seq.record.mark_first_token(end_s)
            if max(seq.request.num_samples, seq.request.beam_width) > 1 and not seq.is_done:
                samples.fork(seq, allocator, scheduler)
        if seq.is_done:
            num_finished += finish_sequence(seq, end_s, scheduler, allocator, samples)
    samples.advance_beams(batch.sequences, allocator, scheduler)  # beam search: fork and drop
    allocator.take_copy_on_writes()  # the engine only counts them; an executor would copy
    return num_finished
