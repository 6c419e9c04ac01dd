"""The buddy allocator: arena decomposition, exact placements, splits and merges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.allocators.buddy import BuddyAllocator, arena_roots, next_power_of_two


def test_next_power_of_two() -> None:
    values = (0, 1, 2, 3, 25, 32, 33, 2048)
    assert [next_power_of_two(value) for value in values] == [1, 1, 2, 4, 32, 32, 64, 2048]


def test_opt13b_arena_is_seven_2048_blocks_then_the_binary_digits_of_1392() -> None:
    roots = arena_roots(15_728, 2048)
    assert roots[:7] == tuple((index * 2048, 2048) for index in range(7))
    assert roots[7:] == ((14_336, 1024), (15_360, 256), (15_616, 64), (15_680, 32), (15_712, 16))


def test_split_places_lowest_address_of_the_smallest_fitting_block() -> None:
    buddy = BuddyAllocator(16, 16)
    assert buddy.allocate(3) == 0  # 16 -> 8 + 8 -> 4 + 4: takes [0, 4)
    assert buddy.free_blocks() == ((4, 4), (8, 8))
    assert buddy.allocate(1) == 4  # splits the free 4 into 2 + 2, then 1 + 1
    assert buddy.free_blocks() == ((5, 1), (6, 2), (8, 8))
    assert buddy.allocate(8) == 8
    assert buddy.allocate(2) == 6
    assert buddy.free_blocks() == ((5, 1),)
    assert buddy.free_slots == 1


def test_free_merges_buddies_back_up_to_the_whole_arena() -> None:
    buddy = BuddyAllocator(16, 16)
    starts = [buddy.allocate(size) for size in (3, 1, 8, 2)]
    assert starts == [0, 4, 8, 6]
    buddy.free(4)  # merges with its free buddy 5 into [4, 6)
    assert buddy.free_blocks() == ((4, 2),)
    buddy.free(6)  # [4, 6) + [6, 8) -> [4, 8)
    assert buddy.free_blocks() == ((4, 4),)
    buddy.free(0)  # [0, 4) + [4, 8) -> [0, 8); its buddy [8, 16) is still held
    assert buddy.free_blocks() == ((0, 8),)
    buddy.free(8)
    assert buddy.free_blocks() == ((0, 16),)
    assert buddy.free_slots == 16


def test_blocks_never_merge_across_top_level_blocks() -> None:
    buddy = BuddyAllocator(48, 16)
    starts = [buddy.allocate(16) for _ in range(3)]
    assert starts == [0, 16, 32]
    for start in starts:
        buddy.free(start)
    assert buddy.free_blocks() == ((0, 16), (16, 16), (32, 16))


def test_a_smaller_remainder_block_is_used_before_splitting_a_larger_one() -> None:
    buddy = BuddyAllocator(24, 16)  # roots [0, 16) and [16, 24)
    assert buddy.allocate(8) == 16
    assert buddy.allocate(5) == 0
    buddy.free(16)
    assert buddy.free_blocks() == ((8, 8), (16, 8))  # equal sizes, different roots: no merge


def test_no_room_and_too_large() -> None:
    buddy = BuddyAllocator(16, 8)
    assert buddy.allocate(8) == 0
    assert buddy.allocate(8) == 8
    assert not buddy.can_allocate(1)
    assert buddy.allocate(1) is None
    assert not buddy.can_allocate(9)
    assert buddy.allocate(9) is None
    with pytest.raises(ValueError):
        buddy.block_slots(9)
    with pytest.raises(KeyError):
        buddy.free(3)


def test_bad_configuration() -> None:
    with pytest.raises(ValueError):
        BuddyAllocator(16, 12)
    with pytest.raises(ValueError):
        BuddyAllocator(-1, 16)


@settings(max_examples=150, deadline=None)
@given(
    num_slots=st.integers(0, 200),
    max_order=st.integers(0, 6),
    operations=st.lists(st.tuples(st.booleans(), st.integers(0, 64)), max_size=60),
)
def test_blocks_tile_the_arena_and_free_buddies_are_always_merged(
    num_slots: int, max_order: int, operations: list[tuple[bool, int]]
) -> None:
    max_order_slots = 1 << max_order
    buddy = BuddyAllocator(num_slots, max_order_slots)
    roots = arena_roots(num_slots, max_order_slots)
    held: dict[int, int] = {}  # start -> slots
    for is_allocation, value in operations:
        if is_allocation:
            num_slots_asked = value % (max_order_slots + 1)
            can = buddy.can_allocate(num_slots_asked)
            start = buddy.allocate(num_slots_asked)
            assert (start is not None) == can
            if start is not None:
                held[start] = buddy.block_slots(num_slots_asked)
        elif held:
            start = sorted(held)[value % len(held)]
            del held[start]
            buddy.free(start)
        free_blocks = buddy.free_blocks()
        blocks = sorted([*held.items(), *free_blocks])
        position = 0
        for start, size in blocks:  # held and free blocks tile [0, num_slots) exactly
            assert start == position and start % size == 0
            position += size
        assert position == num_slots
        assert buddy.free_slots == sum(size for _, size in free_blocks)
        free_set = set(free_blocks)
        for start, size in free_blocks:  # no two free buddies left unmerged
            if (start, size) not in roots:
                assert (start ^ size, size) not in free_set
    for start in list(held):
        buddy.free(start)
    assert buddy.free_blocks() == roots
