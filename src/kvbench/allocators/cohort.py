"""A cohort: paged sequences that each append one token per round, with lazy token counts.

While the engine's running batch only decodes, every running sequence appends one token per
iteration. Holding each member's token count as ``offset + round_index`` makes a round cost
O(blocks it starts) instead of O(members): a member starts a block in the rounds ``r`` with
``(offset + r) % block_size == 0``, so the members are kept in ``block_size`` lists by that phase
(in join order, which is the order single appends would take blocks in), and the rounds in which
members enter the block of their final token (internal fragmentation) are kept in a calendar.

Invariant the owner (``PagedAllocator``) relies on: a member's last block, when partially
filled, is its own (no copy-on-write is pending), so the slots members have not filled yet are
``sum((-num_tokens) % block_size)``, held in ``num_unfilled_slots``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvbench.allocators.base import CohortRounds


class CohortMember(Protocol):
    """What the cohort reads and writes of a paged sequence."""

    final_tokens: int
    num_tokens: int
    blocks: list[int]
    cohort_offset: int | None


def final_block_fragment(final_tokens: int, block_size: int) -> tuple[int, int]:
    """(first token index of the block the final token lies in, slots past the final token in
    that block): the internal fragmentation a sequence has once it enters its final block."""
    final_block_start = (final_tokens - 1) // block_size * block_size
    return final_block_start, final_block_start + block_size - final_tokens


def count_in_calendar(calendar: dict[int, int], round_index: int, slots: int) -> None:
    """Add ``slots`` (negative: take them back) to round ``round_index`` of a calendar of
    internal-fragmentation slots; a round that comes to 0 is dropped."""
    total = calendar.get(round_index, 0) + slots
    if total:
        calendar[round_index] = total
    else:
        calendar.pop(round_index, None)


class Cohort:
    """Lazy bookkeeping of the members' token counts, block starts and internal fragmentation.

    Attributes:
        round_index: rounds advanced so far (a member holds ``cohort_offset + round_index``).
        num_members: sequences in the cohort.
        num_unfilled_slots: slots past the last token in the members' partially filled blocks.
        internal_frag_slots: of those, the slots past the final token of members already in
            their final block.
    """

    def __init__(self, block_size: int, allocate_blocks: Callable[[int], list[int]]) -> None:
        self.block_size = block_size
        self._allocate_blocks = allocate_blocks
        self.round_index = 0
        self.num_members = 0
        self.num_unfilled_slots = 0
        self.internal_frag_slots = 0
        # phase -> members that start a block in the rounds r with r % block_size == phase.
        self._starters: list[list[CohortMember]] = [[] for _ in range(block_size)]
        # round -> internal-fragmentation slots of the members entering their final block then.
        self._frag_calendar: dict[int, int] = {}

    def next_round_blocks(self) -> int:
        """Blocks the next round takes."""
        return len(self._starters[self.round_index % self.block_size])

    def rounds(self) -> CohortRounds:
        """The next rounds' new blocks and internal fragmentation."""
        block_size = self.block_size
        phase = self.round_index % block_size
        counts = [len(members) for members in self._starters]
        return CohortRounds(
            new_blocks=tuple(counts[phase:] + counts[:phase]),
            first_round=self.round_index,
            internal_frag_slots=self._frag_calendar,  # read only: see CohortRounds
        )

    def join(self, member: CohortMember) -> None:
        """Add a sequence (after every member already in: it takes its blocks after theirs)."""
        block_size = self.block_size
        num_tokens = member.num_tokens
        offset = num_tokens - self.round_index
        member.cohort_offset = offset
        self._starters[-offset % block_size].append(member)
        self.num_members += 1
        self.num_unfilled_slots += -num_tokens % block_size
        self._add_fragment(member, offset, +1)

    def leave(self, member: CohortMember) -> None:
        """Remove a sequence, writing its token count back."""
        offset = member.cohort_offset
        assert offset is not None, "not a cohort member"
        block_size = self.block_size
        num_tokens = offset + self.round_index
        self._starters[-offset % block_size].remove(member)
        self.num_members -= 1
        self.num_unfilled_slots -= -num_tokens % block_size
        self._add_fragment(member, offset, -1)
        member.num_tokens = num_tokens
        member.cohort_offset = None

    def advance(self, num_rounds: int) -> int:
        """Append ``num_rounds`` tokens to every member: blocks are taken round by round, in join
        order within a round, as single appends would take them. Returns the new blocks (the
        caller has checked that the pool holds them)."""
        block_size = self.block_size
        first_round = self.round_index
        starters = self._starters
        calendar = self._frag_calendar
        if num_rounds == 1:  # most calls: an iteration that admits
            members = starters[first_round % block_size]
            if calendar:
                self.internal_frag_slots += calendar.pop(first_round, 0)
        else:
            rounds = range(first_round, first_round + num_rounds)
            # The members starting a block, round by round: one allocation for the stretch.
            members = [member for r in rounds for member in starters[r % block_size]]
            if calendar:
                pop = calendar.pop
                self.internal_frag_slots += sum(pop(r, 0) for r in rounds)
        num_new_blocks = len(members)
        if num_new_blocks:
            for member, block_id in zip(
                members, self._allocate_blocks(num_new_blocks), strict=True
            ):
                member.blocks.append(block_id)
        self.round_index = first_round + num_rounds
        # Each member fills one slot per round; one that starts a block opens block_size.
        self.num_unfilled_slots += num_new_blocks * block_size - num_rounds * self.num_members
        return num_new_blocks

    def _add_fragment(self, member: CohortMember, offset: int, sign: int) -> None:
        """Count (sign +1) or uncount (-1) the member's final-block fragment: now if it is in its
        final block, else in the calendar at the round it enters it."""
        final_block_start, slots_past_final = final_block_fragment(
            member.final_tokens, self.block_size
        )
        if not slots_past_final:
            return
        entry_round = final_block_start - offset  # the round that writes token final_block_start
        if entry_round < self.round_index:
            self.internal_frag_slots += sign * slots_past_final
            return
        count_in_calendar(self._frag_calendar, entry_round, sign * slots_past_final)
