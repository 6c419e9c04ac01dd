"""The paged allocator and its block pool: hand-checkable cases."""

from __future__ import annotations

import pytest

from kvbench.allocators import Allocator, MemoryUsage, PagedAllocator
from kvbench.allocators.block_pool import BlockPool
from kvbench.core.request import Request


def _request(prompt_tokens: int, output_tokens: int, request_id: int = 0) -> Request:
    return Request(request_id, 0.0, prompt_tokens, output_tokens)


def test_block_pool_reuses_the_least_recently_freed_block() -> None:
    pool = BlockPool(3)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    assert pool.decref(2) and pool.decref(0)
    assert pool.allocate() == 2
    pool.incref(1)
    assert pool.num_shared_blocks == 1
    assert not pool.decref(1)
    assert pool.num_shared_blocks == 0
    assert (pool.num_free_blocks, pool.num_held_blocks) == (1, 2)
    assert pool.allocate() == 0
    with pytest.raises(RuntimeError):
        pool.allocate()


def test_a_revivable_pool_takes_a_free_block_from_the_middle_of_the_queue() -> None:
    pool = BlockPool(3, revivable=True)
    pool.incref(1)
    assert pool.ref_count(1) == 1
    assert [pool.allocate(), pool.allocate()] == [0, 2]
    with pytest.raises(ValueError):
        BlockPool(3, revivable=True).decref(0)
    with pytest.raises(ValueError, match="revivable"):
        BlockPool(3).incref(1)  # the plain pool's queue only gives blocks from its head


@pytest.mark.parametrize("revivable", [False, True])
def test_bulk_allocate_and_release_match_single_calls(revivable: bool) -> None:
    single, bulk = BlockPool(6, revivable=revivable), BlockPool(6, revivable=revivable)
    assert [single.allocate() for _ in range(4)] == bulk.allocate_many(4) == [0, 1, 2, 3]
    single.incref(2)
    bulk.incref(2)
    for block_id in (3, 2, 0):
        single.decref(block_id)
    bulk.release([3, 2, 0])
    assert single.num_shared_blocks == bulk.num_shared_blocks == 0
    assert [single.allocate() for _ in range(4)] == bulk.allocate_many(4) == [4, 5, 3, 0]
    with pytest.raises(RuntimeError):
        bulk.allocate_many(1)


@pytest.mark.parametrize("revivable", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_a_refused_release_leaves_the_pool_as_it_was(revivable: bool, shared: bool) -> None:
    pool = BlockPool(4, revivable=revivable)
    held = pool.allocate_many(3)
    if shared:
        pool.incref(held[0])  # the general path, with a shared block
    before = (list(pool.ref_counts), pool.free_queue(), pool.num_free_blocks,
              pool.num_shared_blocks)
    with pytest.raises(ValueError, match="already free"):
        pool.release([held[0], held[1], 3])  # block 3 was never allocated
    with pytest.raises(ValueError, match="already free"):
        pool.release([held[1], held[1]])  # the same block twice
    assert (list(pool.ref_counts), pool.free_queue(), pool.num_free_blocks,
            pool.num_shared_blocks) == before


def test_the_100_plus_47_request_holds_ten_16_token_blocks_at_its_end() -> None:
    allocator = PagedAllocator(15_728, 16, 2048)
    assert isinstance(allocator, Allocator)
    assert allocator.admit(0, _request(100, 47), 100)
    usage = allocator.usage()
    assert len(allocator.block_table(0)) == 7
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (100, 12, 0)
    for _ in range(47):
        assert allocator.append(0)
    assert allocator.block_table(0) == tuple(range(10))
    assert allocator.usage() == MemoryUsage(
        num_slots=15_728,
        token_states=147,
        reservation=0,
        internal_frag=13,  # the last block's slots beyond the request's end
        external_frag=0,
        free=15_728 - 160,
    )


def test_pool_leftover_smaller_than_a_block_is_external() -> None:
    usage = PagedAllocator(100, 16, 64).usage()
    assert (usage.external_frag, usage.free) == (4, 96)


def test_freed_blocks_are_reused_tail_first() -> None:
    allocator = PagedAllocator(64, 16, 64)
    assert allocator.admit(0, _request(20, 0), 20)
    assert allocator.admit(1, _request(20, 0), 20)
    allocator.free(0)  # releases block 1, then block 0
    assert allocator.admit(2, _request(10, 0), 10)
    assert allocator.block_table(2) == (1,)


def test_out_of_memory_returns_false_and_changes_nothing() -> None:
    allocator = PagedAllocator(32, 16, 64)
    assert not allocator.can_admit(_request(40, 0), 33)
    assert not allocator.admit(0, _request(40, 0), 33)
    assert allocator.admit(0, _request(40, 0), 32)
    before = allocator.usage()
    assert not allocator.can_append(0)
    assert not allocator.append(0)
    assert allocator.usage() == before
    assert allocator.num_tokens(0) == 32


def test_fork_shares_every_block_and_the_first_write_copies_the_partial_one() -> None:
    allocator = PagedAllocator(64, 4, 64)
    assert allocator.admit(0, _request(6, 4), 6)  # blocks 0 (full) and 1 (2 of 4 tokens)
    assert allocator.fork(0, 1)
    assert allocator.block_table(1) == (0, 1)
    assert (allocator.ref_count(0), allocator.ref_count(1)) == (2, 2)
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (6, 2, 0)
    assert (usage.shared_slots, usage.saved_slots) == (8, 8)
    assert allocator.append(1)
    assert allocator.take_copy_on_writes() == [(1, 2)]
    assert allocator.num_copy_on_writes == 1
    assert allocator.block_table(1) == (0, 2)
    assert allocator.append(0)  # block 1 is the parent's alone now: no copy
    assert allocator.take_copy_on_writes() == []
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.shared_slots) == (4 + 3 + 3, 1 + 1, 4)


def test_fork_of_a_full_last_block_needs_no_copy() -> None:
    allocator = PagedAllocator(64, 4, 64)
    assert allocator.admit(0, _request(8, 4), 8)
    assert allocator.fork(0, 1)
    assert allocator.append(1)
    assert allocator.take_copy_on_writes() == []
    assert allocator.block_table(1) == (0, 1, 2)


def test_can_append_counts_the_copy_a_shared_partial_block_needs() -> None:
    allocator = PagedAllocator(8, 4, 64)
    assert allocator.admit(0, _request(6, 4), 6)  # both blocks of the pool
    assert allocator.fork(0, 1)
    assert not allocator.can_append(1)
    assert not allocator.append(1)
    assert allocator.take_copy_on_writes() == []
    allocator.free(0)
    assert allocator.can_append(1)  # block 1 is no longer shared
    assert allocator.usage().shared_slots == 0


def test_appending_past_the_true_length_counts_as_token_states() -> None:
    allocator = PagedAllocator(64, 4, 64)
    assert allocator.admit(0, _request(2, 1), 2)
    assert allocator.append(0, 3)  # 5 tokens although the request ends at 3
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (5, 0, 3)


def test_misuse_raises() -> None:
    allocator = PagedAllocator(64, 4, 64)
    assert allocator.admit(0, _request(2, 1), 2)
    with pytest.raises(ValueError):
        allocator.admit(0, _request(2, 1), 2)
    with pytest.raises(ValueError):
        allocator.fork(0, 0)
    with pytest.raises(ValueError):
        allocator.append(0, -1)
    for call in (allocator.append, allocator.can_append, allocator.free, allocator.block_table):
        with pytest.raises(KeyError):
            call(9)
    with pytest.raises(ValueError):
        PagedAllocator(64, 0, 64)
