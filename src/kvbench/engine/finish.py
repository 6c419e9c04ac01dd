"""The end of an iteration: its sequences' tokens come out, samples fork, finished sequences go
(every engine path does it the same way)."""

from __future__ import annotations

from kvbench.allocators.base import Allocator
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Batch, Scheduler
from kvbench.engine.sequence import Sequence


def finish_sequence(
    seq: Sequence, end_s: float, scheduler: Scheduler, allocator: Allocator,
    samples: SampleGroups,
) -> bool:
    """Record the slots it held at its end, free it, and close its request's record if it was
    the request's last sequence (then True)."""
    seq.record.peak_slots = max(seq.record.peak_slots, allocator.held_slots(seq.seq_id))
    scheduler.finish(allocator, seq)
    if not samples.finish(seq):
        return False
    seq.record.finish_s = end_s
    seq.record.status = "finished"
    return True


def record_admission(seq: Sequence, now_s: float) -> None:
    """Note a prefilled sequence's first admission (a recomputed one keeps its first)."""
    if seq.record.admit_s != seq.record.admit_s:  # NaN: first admission
        seq.record.admit_s = now_s
        seq.record.cached_prompt_tokens = seq.num_cached_tokens


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
        record_admission(seq, now_s)
    num_finished = 0
    for seq in batch.sequences:
        seq.num_generated += 1
        if seq.num_generated == 1:
            seq.record.first_token_s = end_s
            if max(seq.request.num_samples, seq.request.beam_width) > 1 and not seq.is_done:
                samples.fork(seq, allocator, scheduler)
        if seq.is_done:
            num_finished += finish_sequence(seq, end_s, scheduler, allocator, samples)
    samples.advance_beams(batch.sequences, allocator, scheduler)  # beam search: fork and drop
    allocator.take_copy_on_writes()  # the engine only counts them; an executor would copy
    return num_finished
