"""Parallel sampling: a request's prompt is prefilled once, then forks into n sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.allocators.base import Allocator
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.sequence import Sequence


@dataclass
class SampleGroups:
    """The sequences each request still runs, and fresh sequence ids for forked samples.

    A request starts as one sequence (id = its request id). When its first token is out and it
    asks for ``num_samples`` n > 1, the allocator forks n - 1 children from it (paged allocators
    share the prompt's blocks and copy a shared partial block on the first write; contiguous
    ones copy the extent). A child the allocator has no room for waits at the head of the queue
    and is recomputed like a preempted sequence. The request finishes with its last sample.
    """

    next_seq_id: int
    running_samples: dict[int, int] = field(default_factory=dict)  # request id -> sequences

    def start(self, seq: Sequence) -> None:
        """Count a request's first sequence."""
        self.running_samples[seq.request.request_id] = 1

    def fork(self, parent: Sequence, allocator: Allocator, scheduler: Scheduler) -> None:
        """Fork the parent's ``num_samples - 1`` siblings after its first token."""
        for _ in range(parent.request.num_samples - 1):
            child = Sequence(
                request=parent.request,
                record=parent.record,
                seq_id=self.next_seq_id,
                num_generated=parent.num_generated,
            )
            self.next_seq_id += 1
            self.running_samples[parent.request.request_id] += 1
            if allocator.fork(parent.seq_id, child.seq_id):
                scheduler.running.append(child)
            else:
                scheduler.waiting.appendleft(child)

    def finish(self, seq: Sequence) -> bool:
        """Count a finished sequence; True when it was its request's last one."""
        request_id = seq.request.request_id
        self.running_samples[request_id] -= 1
        return self.running_samples[request_id] == 0
