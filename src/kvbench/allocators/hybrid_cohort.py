"""The hybrid manager's decode cohort: running sequences that only decode, grown lazily
(``PagedHybridAllocator.join_cohort``, ``join_decoders``; driven by the vLLM-v0 engine's
``LazyBatch`` or vLLM v1's ``LazyDecoders``).

A member decodes one token a round, and its token count is ``offset + round``. vLLM's
``allocate_slots`` changes something for it in a round only when the token starts a block (a new
block in every group) or a block falls wholly behind a sliding group's window (freed first). With
one token a round, each recurs every ``block_size`` rounds at a fixed phase. So the members are
kept in ``block_size`` dicts by the phases they act in, in running order, and a round acts for
those of its phase in that order: the same frees and allocations, in the same order, as one
``append`` per member would make, at O(the members that act). A member also acts in its first
round when its last prefill chunk left blocks behind a window (they are freed then).

The members' partly filled last blocks are counted here as rounds run, as ``V1KVCache``'s cohort
counts them, so the pool's usage costs nothing per member. Without a prefix cache only (a
round would cache the blocks it fills); a member may share blocks with a fork (vLLM-v0 engine's
parallel sampling) but for its last one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kvbench.allocators.cohort import count_in_calendar, final_block_fragment


class CohortSequence(Protocol):
    """What the cohort reads and writes of a ``paged_hybrid`` sequence."""

    final_tokens: int
    num_tokens: int
    tables: list[list[int | None]]
    first_live: list[int]


_SeqT = TypeVar("_SeqT", bound=CohortSequence)


@dataclass(slots=True, eq=False)
class _Member(Generic[_SeqT]):
    seq: _SeqT
    offset: int  # its tokens in round r: offset + r
    num_unprocessed_tokens: int  # the window is placed after all tokens but these
    phases: tuple[int, ...]  # round % block_size of the rounds it acts in
    frag_round: int  # the round that starts the block of its final token
    unused_slots: int  # that block's slots past the final token


class HybridDecodeCohort(Generic[_SeqT]):
    """Members (running order) of a ``PagedHybridAllocator`` that each grow a token a round.

    Args:
        block_size: tokens per block.
        windows: per group, its sliding window in tokens (None: full attention).
        free_behind_window: frees a sequence's table entries ``[first, end)`` of a group (the
            allocator's ``append`` does the same).
        start_blocks: gives a sequence a new block in every group, in group order.
        ref_counts: the pool's references per block (read: a freed entry frees its block only
            when it holds the last one).

    Attributes:
        round_index: rounds run since the cohort was made.
        num_partial: members whose last block is partly filled.
        partial_filled_slots: slots of one layer those blocks hold tokens in.
        internal_frag_slots: slots of one layer of those blocks that no token will fill.
    """

    def __init__(
        self,
        block_size: int,
        windows: list[int | None],
        free_behind_window: Callable[[_SeqT, int, int, int], None],
        start_blocks: Callable[[_SeqT], None],
        ref_counts: Sequence[int],
    ) -> None:
        self.block_size = block_size
        self._sliding = [(group, window) for group, window in enumerate(windows)
                         if window is not None]  # fmt: skip
        self._num_groups = len(windows)
        self._free_behind_window = free_behind_window
        self._start_blocks = start_blocks
        self._ref_counts = ref_counts
        self.round_index = 0
        self._members: dict[int, _Member[_SeqT]] = {}
        # phase -> the members (running order) acting in rounds r with r % block_size == phase.
        self._acting: list[dict[int, _Member[_SeqT]]] = [{} for _ in range(block_size)]
        # phase -> members starting a block in those rounds.
        self._num_starting = [0] * block_size
        # Joined since the last round, acting in it off their phases: seq id -> its phase.
        self._first_round: dict[int, int] = {}
        self._frag_calendar: dict[int, int] = {}  # round -> never-filled slots entered in it
        self.num_partial = 0
        self.partial_filled_slots = 0
        self.internal_frag_slots = 0

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._members

    def num_tokens(self, seq_id: int) -> int:
        """A member's tokens now."""
        return self._members[seq_id].offset + self.round_index

    def join(self, seq_id: int, seq: _SeqT, num_unprocessed_tokens: int) -> None:
        """Add a sequence after the members (its tokens all allocated, its last block its own);
        each round then places its windows after all its tokens but ``num_unprocessed_tokens``
        (under async scheduling, the one in flight), as ``append`` would."""
        block_size = self.block_size
        round_index = self.round_index
        num_tokens = seq.num_tokens
        offset = num_tokens - round_index
        start_phase = -offset % block_size
        phases = {start_phase}
        for _, window in self._sliding:
            # The window's first block falls behind it when offset + r - unprocessed - window
            # + 1 is a multiple of block_size.
            phases.add((num_unprocessed_tokens + window - 1 - offset) % block_size)
        final_block_start, unused_slots = final_block_fragment(seq.final_tokens, block_size)
        member = _Member(
            seq=seq,
            offset=offset,
            num_unprocessed_tokens=num_unprocessed_tokens,
            phases=tuple(phases),
            frag_round=round_index + final_block_start - num_tokens,
            unused_slots=unused_slots,
        )
        self._members[seq_id] = member
        for phase in phases:
            self._acting[phase][seq_id] = member
        self._num_starting[start_phase] += 1
        first_phase = round_index % block_size
        if first_phase not in phases and self._num_released(member, num_tokens, {}):
            self._acting[first_phase][seq_id] = member
            self._first_round[seq_id] = first_phase
        if unused_slots and member.frag_round >= round_index:
            count_in_calendar(self._frag_calendar, member.frag_round, unused_slots)
        self._count_partial(num_tokens, member, 1)

    def leave(self, seq_id: int) -> _SeqT:
        """Take a member out, its token count written back."""
        member = self._members.pop(seq_id)
        for phase in member.phases:
            del self._acting[phase][seq_id]
        block_size = self.block_size
        self._num_starting[-member.offset % block_size] -= 1
        first_phase = self._first_round.pop(seq_id, None)
        if first_phase is not None:
            del self._acting[first_phase][seq_id]
        num_tokens = member.offset + self.round_index
        if member.unused_slots and member.frag_round >= self.round_index:  # not entered yet
            count_in_calendar(self._frag_calendar, member.frag_round, -member.unused_slots)
        self._count_partial(num_tokens, member, -1)
        member.seq.num_tokens = num_tokens
        return member.seq

    def round_need(self) -> int:
        """Free blocks the next round needs: the most its members' new blocks outrun the blocks
        their frees (each member's before its growth) have given back, at any point."""
        round_index = self.round_index
        block_size = self.block_size
        num_groups = self._num_groups
        balance = need = 0
        released: dict[int, int] = {}  # block -> references the round drops before
        for member in self._acting[round_index % block_size].values():
            num_tokens = member.offset + round_index
            balance += self._num_released(member, num_tokens, released)
            if num_tokens % block_size == 0:
                balance -= num_groups
                need = max(need, -balance)
        return need

    def advance(self, num_rounds: int) -> None:
        """Run ``num_rounds`` rounds (the caller has checked ``round_need`` for each)."""
        block_size = self.block_size
        num_members = len(self._members)
        for _ in range(num_rounds):
            round_index = self.round_index
            for member in self._acting[round_index % block_size].values():
                self._act(member, member.offset + round_index)
            for seq_id, phase in self._first_round.items():
                del self._acting[phase][seq_id]
            self._first_round.clear()
            # After the round, the members whose next token starts a block have a full last
            # block; every other member's last block holds one token more.
            num_full = self._num_starting[(round_index + 1) % block_size]
            self.num_partial = num_members - num_full
            self.partial_filled_slots += num_members - block_size * num_full
            self.internal_frag_slots += self._frag_calendar.pop(round_index, 0)
            self.round_index = round_index + 1

    def _act(self, member: _Member[_SeqT], num_tokens: int) -> None:
        """What one ``append`` of a token to a sequence of ``num_tokens`` tokens does: free
        each sliding group's entries behind its window, then start a block in every group."""
        seq = member.seq
        processed = num_tokens - member.num_unprocessed_tokens
        block_size = self.block_size
        for group, window in self._sliding:
            end = min(max(0, processed - window + 1) // block_size, len(seq.tables[group]))
            first = seq.first_live[group]
            if end > first:
                self._free_behind_window(seq, group, first, end)
        if num_tokens % block_size == 0:
            self._start_blocks(seq)

    def _num_released(self, member: _Member[_SeqT], num_tokens: int,
                      released: dict[int, int]) -> int:  # fmt: skip
        """Blocks ``_act`` gives back to the pool for a sequence of ``num_tokens`` tokens: the
        entries it frees whose last reference it holds, after the references ``released``
        (block -> references dropped earlier in the round), which it adds its own to."""
        seq = member.seq
        processed = num_tokens - member.num_unprocessed_tokens
        block_size = self.block_size
        ref_counts = self._ref_counts
        num_released = 0
        for group, window in self._sliding:
            table = seq.tables[group]
            end = min(max(0, processed - window + 1) // block_size, len(table))
            for block_id in table[seq.first_live[group]:end]:
                assert block_id is not None  # entries from first_live on are live
                num_dropped = released.get(block_id, 0)
                num_released += ref_counts[block_id] - num_dropped == 1
                released[block_id] = num_dropped + 1
        return num_released

    def _count_partial(self, num_tokens: int, member: _Member[_SeqT], sign: int) -> None:
        """Count a member's partly filled last block in (``sign`` 1) or out (-1), as the
        allocator's usage counts one (``_track_last_blocks``)."""
        block_size = self.block_size
        filled = num_tokens % block_size
        if not filled:
            return
        first_token = num_tokens - filled
        usable = min(max(member.seq.final_tokens, num_tokens) - first_token, block_size)
        self.num_partial += sign
        self.partial_filled_slots += sign * filled
        self.internal_frag_slots += sign * (block_size - usable)
