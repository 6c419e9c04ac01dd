"""Parallel sampling and beam search: a request's prompt is prefilled once, then forks into n
samples (or k beams, which ``kvbench.engine.beams`` then reorganizes every step)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.allocators.base import Allocator
from kvbench.engine.beams import Ancestry, BeamGroups
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

    A beam request (``beam_width`` k > 1) forks into k beams the same way; ``advance_beams``
    then follows the recorded ``beam_ancestry`` after every step (``kvbench.engine.beams``).
    """

    next_seq_id: int
    running_samples: dict[int, int] = field(default_factory=dict)  # request id -> sequences
    beam_ancestry: Ancestry = field(default_factory=dict)
    beams: BeamGroups = field(init=False)

    def __post_init__(self) -> None:
        self.beams = BeamGroups(self.beam_ancestry)

    def start(self, seq: Sequence) -> None:
        """Count a request's first sequence."""
        self.running_samples[seq.request.request_id] = 1

    def fork(self, parent: Sequence, allocator: Allocator, scheduler: Scheduler) -> None:
        """Fork the parent's ``num_samples - 1`` (or ``beam_width - 1``) siblings after its first
        token."""
        request = parent.request
        children = []
        for _ in range(max(request.num_samples, request.beam_width) - 1):
            child = parent.fork(self.new_seq_id())
            children.append(child)
            self.running_samples[request.request_id] += 1
            scheduler.fork(allocator, parent, child)
        if request.beam_width > 1:
            self.beams.start(parent, children)

    def new_seq_id(self) -> int:
        """A sequence id no other sequence of the run has."""
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def advance_beams(
        self, ran: list[Sequence], allocator: Allocator, scheduler: Scheduler
    ) -> None:
        """Reorganize the beams of every beam request that just ran a step (see ``BeamGroups``)."""
        if self.beams.beams:
            self.beams.advance(ran, allocator, scheduler, self.new_seq_id)

    def finish(self, seq: Sequence) -> bool:
        """Count a finished sequence; True when it was its request's last one."""
        request_id = seq.request.request_id
        self.running_samples[request_id] -= 1
        if self.running_samples[request_id]:
            return False
        self.beams.drop(request_id)
        return True
