"""The naive contiguous allocators (the paper's Orca baselines) and their reservation policies.

Each sequence reserves, at admission, one contiguous extent in a linear arena, placed by a binary
buddy allocator. The three policies differ only in how many slots they ask for: Orca (Max) the
model's maximum length, Orca (Pow2) the prompt plus an output guess at most 2x too large, Orca
(Oracle) the prompt plus the true output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from kvbench.allocators.base import CohortRounds, MemoryUsage, check_token_count
from kvbench.allocators.buddy import BuddyAllocator, next_power_of_two
from kvbench.core.request import Request


@dataclass(slots=True)
class _Extent:
    """One sequence's contiguous reservation."""

    request: Request
    start_slot: int
    block_slots: int  # the buddy block held
    requested_slots: int  # what the policy asked for (<= block_slots)
    final_tokens: int  # the request's true final length, capped at max_model_len
    num_tokens: int  # stale while in the cohort: then cohort_offset + the cohort's round
    cohort_offset: int | None = None

    def breakdown(self) -> tuple[int, int, int, int]:
        """(token_states, reservation, internal_frag, external_frag) of the slots held."""
        # A sequence may outgrow its guess into the buddy slack, or its true length: what it
        # holds then counts as used, so the four parts always add up to the buddy block.
        used_slots = max(self.requested_slots, self.num_tokens)
        final_tokens = max(self.final_tokens, self.num_tokens)
        will_hold_slots = min(used_slots, final_tokens)
        return (
            self.num_tokens,
            will_hold_slots - self.num_tokens,
            used_slots - will_hold_slots,
            self.block_slots - used_slots,
        )


class ContiguousAllocator(ABC):
    """One buddy-placed contiguous extent per sequence; ``block_size`` is 1 (tables list slots).

    Subclasses set ``name`` and say how many slots a request reserves (``_requested_slots``).
    """

    name: str
    block_size = 1
    prefix_cache = None  # every extent is its own: nothing is shared across requests
    forks_share_blocks = False  # a fork copies the parent's tokens into an extent of its own

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        if max_model_len < 1:
            raise ValueError(f"max_model_len={max_model_len}: must be >= 1")
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        self._buddy = BuddyAllocator(num_slots, next_power_of_two(max_model_len))
        # Top-level arena blocks too small for even the smallest request can never be handed
        # out: they are "external fragmentation & others" from the start (Orca (Max)'s 8.85 %).
        smallest_block_slots = self._buddy.block_slots(self._smallest_request_slots())
        self._unusable_slots = sum(
            size for _, size in self._buddy.roots if size < smallest_block_slots
        )
        self._extents: dict[int, _Extent] = {}
        self._copies: list[tuple[int, int]] = []
        # Running sums of _Extent.breakdown() over live sequences, so usage() is O(1).
        self._held_breakdown = [0, 0, 0, 0]
        # The cohort: sequences advanced a token per round lazily (advance_cohort).
        self._cohort_round = 0
        self._num_cohort_members = 0

    @abstractmethod
    def _requested_slots(self, request: Request) -> int:
        """Slots the policy reserves for ``request`` (before the buddy's power-of-two rounding)."""

    def _smallest_request_slots(self) -> int:
        """The fewest slots any request can ask for."""
        return 1

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, without changing anything."""
        return self._buddy.can_allocate(self._extent_slots(request, num_tokens))

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Reserve the sequence's extent, holding ``num_tokens`` tokens. False if no room."""
        if seq_id in self._extents:
            raise ValueError(f"sequence {seq_id} is already allocated")
        requested_slots = self._extent_slots(request, num_tokens)
        start_slot = self._buddy.allocate(requested_slots)
        if start_slot is None:
            return False
        extent = _Extent(
            request=request,
            start_slot=start_slot,
            block_slots=self._buddy.block_slots(requested_slots),
            requested_slots=requested_slots,
            final_tokens=min(request.total_tokens, self.max_model_len),
            num_tokens=num_tokens,
        )
        self._extents[seq_id] = extent
        self._add_breakdown(extent, 1)
        return True

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether the sequence's buddy block has room for ``num_tokens`` more tokens."""
        check_token_count(num_tokens)
        extent = self._extents[seq_id]
        return extent.num_tokens + num_tokens <= extent.block_slots

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow the sequence inside its extent. False (nothing changes) if it would overrun it."""
        self._check_not_in_cohort(self._extents[seq_id])
        if not self.can_append(seq_id, num_tokens):
            return False
        extent = self._extents[seq_id]
        self._add_breakdown(extent, -1)
        extent.num_tokens += num_tokens
        self._add_breakdown(extent, 1)
        return True

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """One ``append(seq_id, 1)`` for each of ``seq_ids``, in one call, if each stays within
        what it reserved and will hold; False (nothing changes) otherwise."""
        extents = self._extents
        for seq_id in seq_ids:
            extent = extents[seq_id]
            if extent.num_tokens >= min(extent.requested_slots, extent.final_tokens):
                return False
        # Within those, each token turns one reserved slot into a token state.
        for seq_id in seq_ids:
            extents[seq_id].num_tokens += 1
        self._held_breakdown[0] += len(seq_ids)
        self._held_breakdown[1] -= len(seq_ids)
        return True

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """Let ``advance_cohort`` append a token per round to each of ``seq_ids`` (lazily), if
        each reserved at least what it will finally hold: every round then turns one reserved
        slot of each into a token state. False (nothing changes) otherwise."""
        extents = [self._extents[seq_id] for seq_id in seq_ids]
        for extent in extents:
            if extent.cohort_offset is not None:
                raise ValueError("the sequence is already in the cohort")
            if not extent.num_tokens <= extent.final_tokens <= extent.requested_slots:
                return False
        for extent in extents:
            extent.cohort_offset = extent.num_tokens - self._cohort_round
        self._num_cohort_members += len(extents)
        return True

    def leave_cohort(self, seq_ids: list[int]) -> None:
        """Take the sequences out of the cohort (their token counts written back)."""
        for seq_id in seq_ids:
            self._leave_cohort(self._extents[seq_id])

    def cohort_next_round_blocks(self) -> int:
        """0: cohort rounds fill reserved slots."""
        return 0

    def cohort_rounds(self) -> CohortRounds:
        """Rounds allocate nothing and add no internal fragmentation."""
        return CohortRounds(new_blocks=(0,), first_round=self._cohort_round,
                            internal_frag_slots={})

    def advance_cohort(self, num_rounds: int) -> None:
        """Append ``num_rounds`` tokens to every cohort member."""
        num_tokens = num_rounds * self._num_cohort_members
        self._held_breakdown[0] += num_tokens
        self._held_breakdown[1] -= num_tokens
        self._cohort_round += num_rounds

    def num_free_blocks(self) -> int:
        """Free slots (``block_size`` is 1)."""
        return self._buddy.free_slots - self._unusable_slots

    def _leave_cohort(self, extent: _Extent) -> None:
        assert extent.cohort_offset is not None, "not a cohort member"
        extent.num_tokens = extent.cohort_offset + self._cohort_round
        extent.cohort_offset = None
        self._num_cohort_members -= 1

    def _check_not_in_cohort(self, extent: _Extent) -> None:
        if extent.cohort_offset is not None:
            raise RuntimeError("the sequence is in the cohort: leave_cohort first")

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Reserve a new extent as large as the parent's and copy its tokens into it (one
        (src_slot, dst_slot) pair per token in ``take_copy_on_writes``). False if no room."""
        if child_id in self._extents:
            raise ValueError(f"sequence {child_id} is already allocated")
        parent = self._extents[parent_id]
        self._check_not_in_cohort(parent)
        start_slot = self._buddy.allocate(parent.block_slots)
        if start_slot is None:
            return False
        child = replace(parent, start_slot=start_slot)
        self._extents[child_id] = child
        self._add_breakdown(child, 1)
        self._copies.extend(
            (parent.start_slot + offset, start_slot + offset) for offset in range(parent.num_tokens)
        )
        return True

    def free(self, seq_id: int) -> None:
        """Release the sequence's extent."""
        extent = self._extents.pop(seq_id)
        if extent.cohort_offset is not None:
            self._leave_cohort(extent)
        self._add_breakdown(extent, -1)
        self._buddy.free(extent.start_slot)

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence currently holds."""
        extent = self._extents[seq_id]
        if extent.cohort_offset is not None:
            return extent.cohort_offset + self._cohort_round
        return extent.num_tokens

    def held_slots(self, seq_id: int) -> int:
        """Slots the sequence's extent holds (its buddy block)."""
        return self._extents[seq_id].block_slots

    def extent(self, seq_id: int) -> tuple[int, int]:
        """(start_slot, num_slots) of the buddy block the sequence holds."""
        extent = self._extents[seq_id]
        return extent.start_slot, extent.block_slots

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Slot ids of the sequence's whole extent, in order (``block_size`` is 1)."""
        start_slot, num_slots = self.extent(seq_id)
        return tuple(range(start_slot, start_slot + num_slots))

    def free_extents(self) -> tuple[tuple[int, int], ...]:
        """The arena's free buddy blocks as (start_slot, num_slots), by address."""
        return self._buddy.free_blocks()

    def take_copy_on_writes(self) -> list[tuple[int, int]]:
        """(src_slot, dst_slot) copies made by forks since the last call."""
        copies, self._copies = self._copies, []
        return copies

    def usage(self) -> MemoryUsage:
        """The arena split into the paper's categories (definitions in docs/metrics.md)."""
        token_states, reservation, internal_frag, rounding_slots = self._held_breakdown
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=token_states,
            reservation=reservation,
            internal_frag=internal_frag,
            external_frag=rounding_slots + self._unusable_slots,
            free=self._buddy.free_slots - self._unusable_slots,
        )

    def _extent_slots(self, request: Request, num_tokens: int) -> int:
        """Slots to ask the buddy for: the policy's size, or more if the sequence already is."""
        check_token_count(num_tokens)
        return max(self._requested_slots(request), num_tokens)

    def _add_breakdown(self, extent: _Extent, sign: int) -> None:
        token_states, reservation, internal_frag, rounding_slots = extent.breakdown()
        totals = self._held_breakdown
        totals[0] += sign * token_states
        totals[1] += sign * reservation
        totals[2] += sign * internal_frag
        totals[3] += sign * rounding_slots


class NaiveMaxAllocator(ContiguousAllocator):
    """Orca (Max): reserves ``max_model_len`` contiguous slots per request, whatever its true
    length."""

    name = "naive_max"

    def _requested_slots(self, request: Request) -> int:
        return self.max_model_len

    def _smallest_request_slots(self) -> int:
        # Every request asks for max_model_len, so smaller top-level blocks are never usable.
        return self.max_model_len


def output_guess_tokens(output_tokens: int) -> int:
    """The output length Orca (Pow2) reserves: the next power of two (25 -> 32, 0 -> 0)."""
    return next_power_of_two(output_tokens) if output_tokens > 0 else 0


class NaivePow2Allocator(ContiguousAllocator):
    """Orca (Pow2): reserves prompt + ``output_guess_tokens(output)`` slots (the output length
    over-guessed by at most 2x), capped at ``max_model_len``."""

    name = "naive_pow2"

    def _requested_slots(self, request: Request) -> int:
        guess_tokens = request.prompt_tokens + output_guess_tokens(request.output_tokens)
        return min(guess_tokens, self.max_model_len)


class NaiveOracleAllocator(ContiguousAllocator):
    """Orca (Oracle): reserves exactly prompt + true output slots (capped at ``max_model_len``);
    the buddy's power-of-two rounding is its only waste."""

    name = "naive_oracle"

    def _requested_slots(self, request: Request) -> int:
        return min(request.total_tokens, self.max_model_len)
