"""vLLM v1's decoding requests advanced lazily: the fast path of ``V1StepScheduler``.

Most of a busy step's running requests only decode: each computes its last sampled token and
samples the next. ``LazyDecoders`` holds a prefix of the running list in that state as a round
count instead: a member joined at round ``r0`` has computed and taken in ``round - r0`` tokens
more than its ``V1Sequence`` says, its memory grows it a token a round (``DecodingMemory``: O(the
blocks a round starts)), and the rounds that sample members' last tokens wait in a
``FinishCalendar``. A step then costs O(what is not a member), and a stretch of decode-only
steps O(1) a step. ``leave_all`` writes the counts back before anything that reads them.
"""

from __future__ import annotations

from typing import Protocol

from kvbench.allocators.base import CohortRounds
from kvbench.engine.kv_cache_v1 import V1Sequence
from kvbench.engine.lazy_batch import FinishCalendar


class DecodingMemory(Protocol):
    """A v1 memory that grows a cohort of decoding sequences a token per round, lazily
    (``V1KVCache``, ``ReservingV1Memory``, ``HybridV1Memory``)."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks (slots for a contiguous allocator) free to take."""
        ...

    def join_decoders(self, seqs: list[V1Sequence]) -> bool:
        """Take the decoding ``seqs`` (counts current) into the cohort after its members, or
        False (nothing changes)."""
        ...

    def next_round_blocks(self) -> int:
        """Free blocks the next round needs: the blocks it takes beyond those it frees before
        (a sliding window's)."""
        ...

    def decode_rounds(self) -> CohortRounds | None:
        """The blocks and internal fragmentation of the next rounds; None when rounds free
        blocks too (no decode stretch runs)."""
        ...

    def advance_decoders(self, num_rounds: int) -> None:
        """Grow every member by ``num_rounds`` tokens (the free blocks hold them)."""
        ...

    def leave_decoders(self, seqs: list[V1Sequence]) -> None:
        """Take ``seqs`` out of the cohort, their counts written back."""
        ...


class LazyDecoders:
    """The first ``len(self)`` running requests of a ``V1StepScheduler``, each decoding one
    token a round, with stale counts (``V1Sequence.num_computed_tokens`` and
    ``num_output_tokens`` as of the round it joined)."""

    __slots__ = ("_finishing", "_joined", "computed_tokens", "memory", "round_index")

    def __init__(self, memory: DecodingMemory) -> None:
        self.memory = memory
        self.round_index = 0  # rounds run
        self._joined: dict[V1Sequence, int] = {}  # member -> round it joined at, running order
        # The round that samples a member's last token: synchronously its step takes it in,
        # under async scheduling the next step.
        self._finishing: FinishCalendar[V1Sequence] = FinishCalendar()
        self.computed_tokens = 0  # the members' computed tokens, now

    def __len__(self) -> int:
        return len(self._joined)

    def join(self, seqs: list[V1Sequence]) -> bool:
        """Make ``seqs`` (decoding, following the members in running order) members, or False
        (nothing changes) when the memory cannot grow them lazily."""
        if not self.memory.join_decoders(seqs):
            return False
        round_index = self.round_index
        for seq in seqs:
            self._joined[seq] = round_index
            finish_round = round_index + seq.request.output_tokens - seq.num_generated_tokens
            self._finishing.add(finish_round, seq)
            self.computed_tokens += seq.num_computed_tokens
        return True

    def rounds_before_finish(self) -> int:
        """Rounds that run before the first that samples a member's last token."""
        return self._finishing.first_round() - self.round_index - 1

    def advance(self, num_rounds: int) -> None:
        """Run ``num_rounds`` rounds: every member computes and samples a token in each."""
        self.memory.advance_decoders(num_rounds)
        self.round_index += num_rounds
        self.computed_tokens += num_rounds * len(self._joined)

    def take_finishers(self, *, pending_take_in: bool) -> list[V1Sequence]:
        """The members whose last token the last round sampled, in running order, out of the
        cohort with their counts written back. ``pending_take_in``: the round's tokens are not
        taken in yet (synchronously, at the end of its step; under async scheduling, the
        next step starts with the round's tokens as placeholders and the ones before taken
        in)."""
        finishers = self._finishing.pop(self.round_index)
        if not finishers:
            return []
        for seq in finishers:
            self._write_back(seq)
            if pending_take_in:
                seq.num_output_tokens -= 1  # the scheduler takes it in
        self.memory.leave_decoders(finishers)
        return finishers

    def leave_all(self) -> None:
        """Write every member's counts back and empty the cohort."""
        members = list(self._joined)
        for seq in members:
            self._write_back(seq)
        self.memory.leave_decoders(members)
        self._finishing.clear()
        self.computed_tokens = 0

    def _write_back(self, seq: V1Sequence) -> None:
        num_rounds = self.round_index - self._joined.pop(seq)
        seq.num_computed_tokens += num_rounds
        seq.num_output_tokens += num_rounds
        self.computed_tokens -= seq.num_computed_tokens
