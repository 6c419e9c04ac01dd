"""Releasing a sequence that produced its last token (both engine paths do it the same way)."""

from __future__ import annotations

from kvbench.allocators.base import Allocator
from kvbench.engine.samples import SampleGroups
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.sequence import Sequence


def finish_sequence(
    seq: Sequence, end_s: float, scheduler: Scheduler, allocator: Allocator,
    samples: SampleGroups,
) -> bool:
    """Record the slots it held at its end, free it, and close its request's record if it was
    the request's last sequence (then True)."""
    held_slots = len(allocator.block_table(seq.seq_id)) * allocator.block_size
    seq.record.peak_slots = max(seq.record.peak_slots, held_slots)
    scheduler.finish(allocator, seq)
    if not samples.finish(seq):
        return False
    seq.record.finish_s = end_s
    seq.record.status = "finished"
    return True
