"""The allocator contract: the protocol every allocator satisfies, the optional abilities some
declare, and the memory-usage breakdown every allocator reports.

``Allocator`` is what every allocator does. Abilities only some have are declared, never probed
for: ``prefix_cache`` (a ``PrefixCache`` component or None) and ``forks_share_blocks`` are
properties of every allocator, read on hot paths; ``RoundsAllocator`` (lazy rounds),
``CohortAllocator`` (lazy rounds described ahead) and ``CopyOnWriteCounter`` are protocols the
engine checks with ``isinstance`` once per run.

All sizes are in token slots: one slot holds the K and V of one token in every layer. Bytes are
computed only by the catalog (``kvbench.core.specs``), from slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from kvbench.core.request import Request

# The paper's categories that partition a pool (MemoryUsage's first five counts), in table order.
USAGE_CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag", "free")


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """The KV pool split into the vLLM paper's categories (§3.1, Fig. 2), in token slots.

    ``token_states + reservation + internal_frag + external_frag + free == num_slots`` always.
    ``shared_slots`` and ``saved_slots`` are views of sharing, not further categories:
    ``shared_slots`` counts physical slots in blocks referenced by more than one sequence (a subset
    of ``token_states`` and ``reservation``); ``saved_slots`` counts logical slots that sharing did
    not have to store (sum over sequences of their logical slots minus the physical slots held).
    Exact definitions: ``docs/metrics.md``.
    """

    num_slots: int
    token_states: int
    reservation: int
    internal_frag: int
    external_frag: int
    free: int
    shared_slots: int = 0
    saved_slots: int = 0

    def __post_init__(self) -> None:
        held = self.token_states + self.reservation + self.internal_frag
        parts = held + self.external_frag + self.free
        if parts != self.num_slots:
            raise ValueError(f"usage categories add up to {parts}, not the pool's {self.num_slots}")

    def with_free_blocked(self) -> MemoryUsage:
        """The same usage with every free slot counted as external fragmentation.

        The engine calls this for a step in which a waiting request could not be admitted for
        lack of memory: the free slots then could not be given to it ("external fragmentation
        & others" in the paper).
        """
        return MemoryUsage(
            num_slots=self.num_slots,
            token_states=self.token_states,
            reservation=self.reservation,
            internal_frag=self.internal_frag,
            external_frag=self.external_frag + self.free,
            free=0,
            shared_slots=self.shared_slots,
            saved_slots=self.saved_slots,
        )

    def as_dict(self) -> dict[str, int]:
        """Field name -> slots, for records and tables."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_token_count(num_tokens: int) -> None:
    """Reject a negative token count (a caller bug, not a lack of memory)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens}: must be >= 0")


class PrefixCacheView(Protocol):
    """What the engine reads of an allocator's prefix cache (``PrefixCache`` of the paged
    allocator, or the radix tree of ``RadixAllocator``)."""

    def cached_prefix_tokens(self, seq_id: int) -> int:
        """Leading tokens whose KV the sequence found cached at its admission."""
        ...

    def match_tokens(self, request: Request, num_tokens: int) -> int:
        """Leading tokens of a sequence of ``num_tokens`` tokens of ``request`` the cache holds
        now (what an admission would hit), without changing anything."""
        ...

    def loaded_prefix_tokens(self, seq_id: int) -> int:
        """Of ``cached_prefix_tokens``, those loaded from the CPU tier (0 without one): the
        engine prices their copy over PCIe."""
        ...


@runtime_checkable
class Allocator(Protocol):
    """What the scheduler needs from every KV-cache allocator.

    Sequences are named by integer ids chosen by the caller (a request's id, or a fresh id for a
    forked sample). Running out of memory is a normal return value (False), never an exception;
    misuse (an unknown id, appending to a freed sequence) raises ``KeyError``/``ValueError``.
    """

    name: str
    num_slots: int  # capacity of the pool in token slots
    block_size: int  # token slots per block-table entry (1 for the contiguous allocators)

    @property
    def prefix_cache(self) -> PrefixCacheView | None:
        """The prefix cache the allocator consults at admission, or None when it has none."""
        ...

    @property
    def forks_share_blocks(self) -> bool:
        """Whether ``fork`` shares the parent's blocks (no new memory; it cannot fail) rather
        than copying them into a reservation of the child's own."""
        ...

    def can_admit(self, request: Request, num_tokens: int) -> bool:
        """Whether ``admit`` would succeed now, without changing anything."""
        ...

    def admit(self, seq_id: int, request: Request, num_tokens: int) -> bool:
        """Allocate a new sequence holding ``num_tokens`` tokens (its prompt, or prompt plus
        already generated tokens when it is recomputed after preemption). False if no room."""
        ...

    def can_append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Whether ``append`` would succeed now, without changing anything."""
        ...

    def append(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Grow the sequence by ``num_tokens`` generated tokens; False if no room (no change)."""
        ...

    def fork(self, parent_id: int, child_id: int) -> bool:
        """Create ``child_id`` sharing (paged) or copying (contiguous) ``parent_id``'s tokens."""
        ...

    def free(self, seq_id: int) -> None:
        """Release everything the sequence holds."""
        ...

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence currently holds."""
        ...

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        """Physical block ids of the sequence, in order (slot ids for contiguous allocators)."""
        ...

    def held_slots(self, seq_id: int) -> int:
        """Slots the sequence's table covers: ``len(block_table(seq_id)) * block_size``."""
        ...

    def take_copy_on_writes(self) -> list[tuple[int, int]]:
        """(src, dst) block copies made since the last call, for the executor to perform."""
        ...

    def try_append_round(self, seq_ids: list[int]) -> bool:
        """One ``append(seq_id, 1)`` for each of ``seq_ids``, in one call, if all of them fit
        at once; False (no change) otherwise. False is always a valid answer: the scheduler then
        appends one by one."""
        ...

    def usage(self) -> MemoryUsage:
        """The pool split into the paper's categories, now."""
        ...


@runtime_checkable
class CopyOnWriteCounter(Protocol):
    """Ability: the allocator counts the copy-on-writes it has made (a write into a shared,
    partially filled block), for the run's records."""

    num_copy_on_writes: int


@dataclass(frozen=True, slots=True)
class CohortRounds:
    """The next rounds of a cohort (``CohortAllocator``), while no member joins or leaves.

    Attributes:
        new_blocks: the round ``k`` rounds from now (0: the next) takes
            ``new_blocks[k % len(new_blocks)]`` new blocks.
        first_round: the cohort's index of the next round.
        internal_frag_slots: cohort round index -> internal-fragmentation slots that round adds
            (members entering the block of their final token); a read-only live view of the
            cohort's calendar (rounds are dropped from it as they run): read it before advancing.
    """

    new_blocks: tuple[int, ...]
    first_round: int
    internal_frag_slots: Mapping[int, int]


@runtime_checkable
class RoundsAllocator(Allocator, Protocol):
    """Ability: the engine's fast path can grow the running batch a token per sequence per
    iteration lazily, at a cost of O(the members a round changes), not O(sequences).

    Members append one token per round, in join order; their token counts are lazy (read them
    with ``num_tokens``); ``free`` takes a member out, and ``append``/``fork`` refuse members.
    """

    def join_cohort(self, seq_ids: list[int]) -> bool:
        """Put the sequences in the cohort that ``advance_cohort`` grows by a token per round
        (lazily), or False (no change) when these sequences cannot be advanced that way."""
        ...

    def leave_cohort(self, seq_ids: list[int]) -> None:
        """Take the sequences out of the cohort."""
        ...

    def cohort_next_round_blocks(self) -> int:
        """Free blocks the next round needs: the blocks it takes beyond those it frees before
        (a sliding window's); fewer free, some member cannot grow."""
        ...

    def advance_cohort(self, num_rounds: int) -> None:
        """Run ``num_rounds`` rounds (the caller has checked the free blocks)."""
        ...

    def num_free_blocks(self) -> int:
        """Blocks free for new allocations."""
        ...


@runtime_checkable
class CohortAllocator(RoundsAllocator, Protocol):
    """Ability: a ``RoundsAllocator`` whose rounds only take blocks, so that the next ones can be
    described ahead (``cohort_rounds``): the engine runs decode-only iterations as stretches,
    O(1) each."""

    def cohort_rounds(self) -> CohortRounds:
        """The blocks and internal fragmentation of the next rounds."""
        ...
