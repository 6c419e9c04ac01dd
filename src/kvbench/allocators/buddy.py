"""A binary buddy allocator over a linear arena of token slots (how the Orca baselines place KV)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort


def next_power_of_two(value: int) -> int:
    """The smallest power of two that is >= ``value`` (1 for any value <= 1)."""
    return 1 << max(0, value - 1).bit_length()


def arena_roots(num_slots: int, max_order_slots: int) -> tuple[tuple[int, int], ...]:
    """The top-level blocks (start_slot, num_slots) a buddy arena of ``num_slots`` is cut into.

    As many ``max_order_slots`` blocks as fit, then the remainder as decreasing powers of two (its
    binary digits). Every block is aligned to its own size, which is what lets buddies be found by
    ``start ^ size``. Example: 15,728 slots with 2048-slot blocks -> 7 x 2048, then 1024, 256, 64,
    32, 16.
    """
    num_full_roots, remainder_slots = divmod(num_slots, max_order_slots)
    roots = [(index * max_order_slots, max_order_slots) for index in range(num_full_roots)]
    start_slot = num_full_roots * max_order_slots
    block_slots = max_order_slots // 2
    while remainder_slots:
        if remainder_slots & block_slots:
            roots.append((start_slot, block_slots))
            start_slot += block_slots
            remainder_slots -= block_slots
        block_slots //= 2
    return tuple(roots)


class BuddyAllocator:
    """Binary buddy allocator: blocks of 2^k slots, split to allocate, merged with buddies on free.

    The arena ``[0, num_slots)`` is cut into top-level blocks (see ``arena_roots``); blocks merge
    only within their top-level block. Placement is deterministic: the smallest free block that
    fits, lowest address first; a split keeps the lower half and frees the upper one.
    """

    def __init__(self, num_slots: int, max_order_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots={num_slots}: must be >= 0")
        if max_order_slots < 1 or max_order_slots & (max_order_slots - 1):
            raise ValueError(f"max_order_slots={max_order_slots}: must be a power of two >= 1")
        self.num_slots = num_slots
        self.max_order_slots = max_order_slots
        self.roots = arena_roots(num_slots, max_order_slots)
        self.free_slots = num_slots
        self._max_order = max_order_slots.bit_length() - 1
        self._root_starts = [start for start, _ in self.roots]
        # One sorted list of block starts per order, so the lowest address is always first.
        self._free_starts_by_order: list[list[int]] = [[] for _ in range(self._max_order + 1)]
        self._free_order_at: dict[int, int] = {}
        self._allocated_order_at: dict[int, int] = {}
        for start, size in self.roots:
            self._add_free(start, size.bit_length() - 1)

    def block_slots(self, num_slots: int) -> int:
        """Slots of the block that ``allocate(num_slots)`` hands out (the power-of-two rounding)."""
        return 1 << self._order_for(num_slots)

    def fits(self, num_slots: int) -> bool:
        """Whether ``num_slots`` is no larger than the largest block (so it could ever fit)."""
        return num_slots <= self.max_order_slots

    def can_allocate(self, num_slots: int) -> bool:
        """Whether ``allocate(num_slots)`` would succeed now."""
        return self.fits(num_slots) and self._smallest_free_order(self._order_for(num_slots)) >= 0

    def allocate(self, num_slots: int) -> int | None:
        """Hand out a block of ``block_slots(num_slots)`` slots: its start slot, None if no room."""
        if not self.fits(num_slots):
            return None
        order = self._order_for(num_slots)
        source_order = self._smallest_free_order(order)
        if source_order < 0:
            return None
        start = self._free_starts_by_order[source_order][0]
        self._remove_free(start, source_order)
        while source_order > order:
            source_order -= 1
            self._add_free(start + (1 << source_order), source_order)
        self._allocated_order_at[start] = order
        self.free_slots -= 1 << order
        return start

    def free(self, start_slot: int) -> None:
        """Return the block starting at ``start_slot``, merging it with free buddies (KeyError if
        no block starts there)."""
        order = self._allocated_order_at.pop(start_slot)
        self.free_slots += 1 << order
        root_order = self._root_order_at(start_slot)
        start = start_slot
        while order < root_order:
            buddy = start ^ (1 << order)
            if self._free_order_at.get(buddy) != order:
                break
            self._remove_free(buddy, order)
            start = min(start, buddy)
            order += 1
        self._add_free(start, order)

    def free_blocks(self) -> tuple[tuple[int, int], ...]:
        """The free blocks as (start_slot, num_slots), by address."""
        return tuple(sorted((start, 1 << order) for start, order in self._free_order_at.items()))

    def _order_for(self, num_slots: int) -> int:
        if num_slots > self.max_order_slots:
            raise ValueError(f"{num_slots} slots exceed the largest block ({self.max_order_slots})")
        return (max(1, num_slots) - 1).bit_length()

    def _smallest_free_order(self, order: int) -> int:
        """The smallest order >= ``order`` with a free block, or -1."""
        for candidate in range(order, self._max_order + 1):
            if self._free_starts_by_order[candidate]:
                return candidate
        return -1

    def _root_order_at(self, start_slot: int) -> int:
        root_slots = self.roots[bisect_right(self._root_starts, start_slot) - 1][1]
        return root_slots.bit_length() - 1

    def _add_free(self, start: int, order: int) -> None:
        insort(self._free_starts_by_order[order], start)
        self._free_order_at[start] = order

    def _remove_free(self, start: int, order: int) -> None:
        starts = self._free_starts_by_order[order]
        del starts[bisect_left(starts, start)]
        del self._free_order_at[start]
