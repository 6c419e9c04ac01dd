"""The allocator registry."""

from __future__ import annotations

import pytest

from kvbench.allocators import (
    ALLOCATOR_NAMES,
    Allocator,
    CohortAllocator,
    CopyOnWriteCounter,
    RoundsAllocator,
    make_allocator,
)


def test_names_in_report_order() -> None:
    assert ALLOCATOR_NAMES == (
        "naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix", "radix",
        "paged_hybrid", "paged_hybrid_prefix", "vattention",
    )  # fmt: skip


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_make_allocator_builds_each_by_name(name: str) -> None:
    allocator = make_allocator(name, 1000, 16, 256)
    assert isinstance(allocator, Allocator)
    assert allocator.name == name
    assert allocator.num_slots == 1000
    # vattention's pages hold block_size tokens unless its settings say otherwise.
    assert allocator.block_size == (16 if name.startswith("paged") or name == "vattention" else 1)
    assert allocator.usage().num_slots == 1000


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_each_declares_its_abilities(name: str) -> None:
    """The engine reads abilities from these declarations, never by probing attributes."""
    allocator = make_allocator(name, 1000, 16, 256)
    is_paged = name.startswith("paged")
    assert (allocator.prefix_cache is not None) == (
        name in ("paged_prefix", "radix", "paged_hybrid_prefix")
    )
    assert allocator.forks_share_blocks == is_paged
    # vattention keeps paged's block pool underneath (a counter that stays 0: it never shares).
    assert isinstance(allocator, CopyOnWriteCounter) == (is_paged or name == "vattention")
    # paged_hybrid's sliding groups free blocks as the sequences grow: lazy rounds, not
    # described ahead.
    assert isinstance(allocator, RoundsAllocator)
    assert isinstance(allocator, CohortAllocator) == (not name.startswith("paged_hybrid"))


def test_unknown_name_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"'buddy'.*naive_max, naive_pow2, naive_oracle, paged"):
        make_allocator("buddy", 1000, 16, 256)
