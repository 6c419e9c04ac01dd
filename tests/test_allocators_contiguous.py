"""The naive contiguous allocators (Orca Max / Pow2 / Oracle): hand-checkable cases."""

from __future__ import annotations

import pytest

from kvbench.allocators import (
    Allocator,
    MemoryUsage,
    NaiveMaxAllocator,
    NaiveOracleAllocator,
    NaivePow2Allocator,
)
from kvbench.allocators.contiguous import output_guess_tokens
from kvbench.core.request import Request

OPT13B_SLOTS = 15_728
OPT_MAX_LEN = 2048


def _request(prompt_tokens: int, output_tokens: int, request_id: int = 0) -> Request:
    return Request(request_id, 0.0, prompt_tokens, output_tokens)


def test_all_satisfy_the_protocol() -> None:
    for cls in (NaiveMaxAllocator, NaivePow2Allocator, NaiveOracleAllocator):
        allocator = cls(64, 16)
        assert isinstance(allocator, Allocator)
        assert allocator.block_size == 1


def test_opt13b_pool_fits_exactly_seven_max_requests_and_1392_slots_are_external() -> None:
    allocator = NaiveMaxAllocator(OPT13B_SLOTS, OPT_MAX_LEN)
    request = _request(100, 47)
    assert allocator.usage().external_frag == 1392
    for seq_id in range(7):
        assert allocator.admit(seq_id, request, 100)
    assert not allocator.can_admit(request, 100)
    assert not allocator.admit(7, request, 100)
    usage = allocator.usage()
    assert usage.external_frag == 1392  # 8.85 % of the pool: the paper's Orca (Max) "others"
    assert usage.free == 0
    assert usage.token_states == 7 * 100
    assert usage.reservation == 7 * 47
    assert usage.internal_frag == 7 * (2048 - 147)


def test_max_reserves_2048_slots_for_the_100_plus_47_request() -> None:
    allocator = NaiveMaxAllocator(OPT13B_SLOTS, OPT_MAX_LEN)
    assert allocator.admit(0, _request(100, 47), 100)
    for _ in range(47):
        assert allocator.append(0)
    assert allocator.extent(0) == (0, 2048)
    assert allocator.block_table(0) == tuple(range(2048))
    assert allocator.num_tokens(0) == 147
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (147, 0, 1901)


def test_pow2_guesses_the_output_at_most_2x() -> None:
    assert [output_guess_tokens(n) for n in (0, 1, 25, 32, 33)] == [0, 1, 32, 32, 64]
    allocator = NaivePow2Allocator(OPT13B_SLOTS, OPT_MAX_LEN)
    assert allocator.admit(0, _request(100, 25), 100)
    # requested 100 + 32 = 132, true final 125, buddy block 256: the arena's free 256-slot
    # top-level block is the smallest that fits
    assert allocator.extent(0) == (15_360, 256)
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation) == (100, 25)
    assert usage.internal_frag == 7  # the over-guess
    assert usage.external_frag == 124  # the buddy rounding 256 - 132


def test_pow2_guess_is_capped_at_max_model_len() -> None:
    allocator = NaivePow2Allocator(OPT13B_SLOTS, OPT_MAX_LEN)
    assert allocator.admit(0, _request(1000, 1025), 1000)  # 1000 + 2048 -> 2048
    usage = allocator.usage()
    assert allocator.extent(0)[1] == 2048
    assert (usage.reservation, usage.internal_frag, usage.external_frag) == (1025, 23, 0)


def test_oracle_rounding_slack_is_external_and_internal_is_zero() -> None:
    allocator = NaiveOracleAllocator(OPT13B_SLOTS, OPT_MAX_LEN)
    assert allocator.admit(0, _request(100, 47), 100)
    assert allocator.usage() == MemoryUsage(
        num_slots=OPT13B_SLOTS,
        token_states=100,
        reservation=47,
        internal_frag=0,
        external_frag=256 - 147,
        free=OPT13B_SLOTS - 256,
    )


def test_only_naive_max_marks_small_top_level_blocks_external() -> None:
    for cls in (NaivePow2Allocator, NaiveOracleAllocator):
        usage = cls(OPT13B_SLOTS, OPT_MAX_LEN).usage()
        assert (usage.external_frag, usage.free) == (0, OPT13B_SLOTS)


def test_appends_may_use_the_buddy_slack_but_not_overrun_the_block() -> None:
    allocator = NaiveOracleAllocator(256, 64)
    assert allocator.admit(0, _request(20, 10), 20)  # requested 30, block 32
    assert allocator.append(0, 10)
    assert allocator.append(0, 2)  # beyond the true length, inside the rounding slack
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (32, 0, 0)
    assert usage.external_frag == 0
    assert not allocator.can_append(0)
    assert not allocator.append(0)
    assert allocator.num_tokens(0) == 32
    assert allocator.usage() == usage


def test_admission_larger_than_the_policy_reserves_the_tokens_it_holds() -> None:
    allocator = NaivePow2Allocator(256, 64)
    assert allocator.admit(0, _request(10, 2), 20)  # e.g. recomputed after over-generating
    assert allocator.extent(0) == (0, 32)
    assert not allocator.can_admit(_request(10, 2), 65)  # larger than any block


def test_fork_copies_the_tokens_into_a_new_extent() -> None:
    allocator = NaiveOracleAllocator(64, 16)
    assert allocator.admit(0, _request(5, 3), 5)
    assert allocator.fork(0, 1)
    assert allocator.extent(1) == (8, 8)
    assert allocator.num_tokens(1) == 5
    assert allocator.take_copy_on_writes() == [(offset, 8 + offset) for offset in range(5)]
    assert allocator.take_copy_on_writes() == []


def test_fork_without_room_changes_nothing() -> None:
    allocator = NaiveMaxAllocator(16, 16)
    assert allocator.admit(0, _request(5, 3), 5)
    before = allocator.usage()
    assert not allocator.fork(0, 1)
    assert allocator.usage() == before
    assert allocator.take_copy_on_writes() == []
    with pytest.raises(KeyError):
        allocator.num_tokens(1)


def test_free_returns_the_whole_extent() -> None:
    allocator = NaiveOracleAllocator(64, 16)
    for seq_id, prompt_tokens in enumerate((3, 9, 5)):
        assert allocator.admit(seq_id, _request(prompt_tokens, 1), prompt_tokens)
    for seq_id in (1, 0, 2):
        allocator.free(seq_id)
    assert allocator.free_extents() == ((0, 16), (16, 16), (32, 16), (48, 16))
    assert allocator.usage().free == 64


def test_misuse_raises() -> None:
    allocator = NaiveOracleAllocator(64, 16)
    assert allocator.admit(0, _request(5, 3), 5)
    with pytest.raises(ValueError):
        allocator.admit(0, _request(5, 3), 5)
    with pytest.raises(ValueError):
        allocator.append(0, -1)
    with pytest.raises(ValueError):
        allocator.can_admit(_request(5, 3), -1)
    for call in (allocator.append, allocator.free, allocator.block_table, allocator.extent):
        with pytest.raises(KeyError):
            call(9)
    with pytest.raises(KeyError):
        allocator.fork(9, 10)
