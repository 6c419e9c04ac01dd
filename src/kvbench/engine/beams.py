"""Beam search: k beams per request, reorganized every step by recorded real beam ancestry.

A request with ``beam_width`` k > 1 is prefilled once as one sequence, which forks into k beams
after its first token (``SampleGroups.fork``, like parallel samples). After every later step the
beams follow a recorded real beam search (``kvbench.workloads.beam_ancestry``, passed in as plain
tuples): step s's parents say which old beam each new beam extends. On allocators that share
blocks on ``fork`` (the paged ones), as vLLM does:

* an old beam with no child is dropped: ``free`` drops its references, and blocks nobody else
  holds return to the pool;
* an old beam with c >= 1 children continues as its first child and is ``fork``-ed for the other
  c - 1: they share all its blocks; each one's first write into a shared, partially filled last
  block copies that block (copy-on-write).

Drops and forks balance (k beams before and after), the dropped beams' places in the running
list go to the forks. Contiguous allocators hold the k beams as k full reservations from the
first token on (the fork copied the extent); reorganizing beams is then a copy inside the
reservations and changes nothing the allocator holds, so the step is a no-op for them.

Pure: no I/O, no torch. The recorded search a request replays is chosen by its id; steps beyond
the recording wrap around to step 1 (step 0, all beams extending the prompt, is the fork). A step
is applied only when all k beams of the request ran it together (none preempted or waiting);
otherwise the beams run on unchanged until they finish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field

from kvbench.allocators.base import Allocator
from kvbench.core.request import Request
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.sequence import Sequence

# beam width -> recorded searches -> steps -> parent (old beam index) of each new beam
Ancestry = Mapping[int, SequenceOf[SequenceOf[SequenceOf[int]]]]


def recorded_parents(ancestry: Ancestry, request: Request, step: int) -> SequenceOf[int]:
    """Parents of the request's k beams at ``step`` (>= 1) of the recorded search it replays.

    The search is ``request_id mod (searches of width k)``; a step past the recording's T steps
    is taken as ``1 + (step - 1) mod (T - 1)`` (a wrap-around that skips the fork step 0).

    Raises:
        ValueError: no search of width k was recorded.
    """
    width = request.beam_width
    searches = ancestry.get(width)
    if not searches:
        recorded = ", ".join(str(k) for k in sorted(ancestry)) or "none"
        raise ValueError(f"beam_width={width} has no recorded beam ancestry "
                         f"(recorded widths: {recorded})")  # fmt: skip
    search = searches[request.request_id % len(searches)]
    if step >= len(search):
        step = 1 + (step - 1) % (len(search) - 1)
    return search[step]


def plan_step(parents: SequenceOf[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """(old beams to drop, (new beam, old beam it forks) pairs) for one step's ``parents``.

    New beam j extends old beam ``parents[j]``; the first new beam naming an old beam continues
    it (no allocator call), every further one is a fork. Drops and forks are equally many.
    """
    continued: set[int] = set()
    forks = []
    for new_beam, parent in enumerate(parents):
        if parent in continued:
            forks.append((new_beam, parent))
        else:
            continued.add(parent)
    dropped = [beam for beam in range(len(parents)) if beam not in continued]
    return dropped, forks


@dataclass
class BeamGroups:
    """Each beam request's live beams, in beam order, and the recorded ancestry they follow."""

    ancestry: Ancestry
    beams: dict[int, list[Sequence]] = field(default_factory=dict)  # request id -> beams
    num_reorganized_steps: int = 0  # steps whose ancestry was applied (all beams in sync)

    def start(self, first: Sequence, children: list[Sequence]) -> None:
        """The request's k beams right after its first token: the prefilled one and its forks."""
        self.beams[first.request.request_id] = [first, *children]

    def drop(self, request_id: int) -> None:
        """Forget a finished request."""
        self.beams.pop(request_id, None)

    def advance(
        self,
        ran: Iterable[Sequence],
        allocator: Allocator,
        scheduler: Scheduler,
        new_seq_id: Callable[[], int],
    ) -> None:
        """Apply the recorded step to every beam request whose k beams all just ran it."""
        if not allocator.forks_share_blocks:
            return  # k full reservations: reorganizing is a copy inside them
        ran_ids = {seq.seq_id for seq in ran if seq.request.beam_width > 1}
        done: set[int] = set()
        for seq in ran:
            request_id = seq.request.request_id
            if seq.seq_id not in ran_ids or request_id in done or seq.is_done:
                continue
            done.add(request_id)
            beams = self.beams.get(request_id)
            if beams is None or seq.num_generated < 2:
                continue
            if any(b.seq_id not in ran_ids or b.num_generated != seq.num_generated
                   for b in beams):  # fmt: skip
                continue  # split by preemption: the beams run on as they are
            parents = recorded_parents(self.ancestry, seq.request, seq.num_generated - 1)
            self.beams[request_id] = self._reorganize(beams, parents, allocator, scheduler,
                                                      new_seq_id)  # fmt: skip
            self.num_reorganized_steps += 1

    @staticmethod
    def _reorganize(
        beams: list[Sequence],
        parents: SequenceOf[int],
        allocator: Allocator,
        scheduler: Scheduler,
        new_seq_id: Callable[[], int],
    ) -> list[Sequence]:
        dropped, forks = plan_step(parents)
        new_beams = [beams[parent] for parent in parents]
        forked = []
        for new_beam, parent in forks:
            source = beams[parent]
            child = source.fork(new_seq_id())
            forked.append((source, child))
            new_beams[new_beam] = child
        scheduler.replace_beams(allocator, [beams[beam] for beam in dropped], forked)
        return new_beams
