"""Prefix sharing: explicit groups, trace block hashes, cached free blocks, LRU eviction."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvbench.allocators import PagedAllocator
from kvbench.allocators.prefix_hashes import prompt_block_hashes
from kvbench.core.request import Request


def _group_request(
    request_id: int, prompt_tokens: int, group: int = 7, prefix: int = 40
) -> Request:
    return Request(request_id, 0.0, prompt_tokens, 10, prefix_group=group, prefix_tokens=prefix)


def _prefix_allocator(num_slots: int, block_size: int, max_model_len: int) -> PagedAllocator:
    return PagedAllocator(num_slots, block_size, max_model_len, enable_prefix_caching=True)


def _hashed_request(trace_hashes: tuple[int, ...], hash_block_tokens: int, prompt: int) -> Request:
    return Request(
        0, 0.0, prompt, 1, prefix_block_hashes=trace_hashes, hash_block_tokens=hash_block_tokens
    )


def test_a_group_shares_the_full_blocks_of_its_prefix() -> None:
    allocator = _prefix_allocator(256, 16, 128)
    assert allocator.admit(0, _group_request(0, 50), 50)  # 4 blocks; 40 // 16 = 2 shareable
    assert allocator.prefix_cache.cached_prefix_tokens(0) == 0
    assert allocator.admit(1, _group_request(1, 60), 60)
    assert allocator.block_table(1)[:2] == allocator.block_table(0)[:2]
    assert allocator.block_table(1)[2:] == (4, 5)
    assert allocator.prefix_cache.cached_prefix_tokens(1) == 32
    assert allocator.prefix_cache.num_hit_blocks == 2
    usage = allocator.usage()
    assert (usage.shared_slots, usage.saved_slots) == (32, 32)
    assert usage.token_states == 50 + 60 - 32
    assert allocator.admit(2, _group_request(2, 50, group=8), 50)  # another group: no hit
    assert allocator.prefix_cache.cached_prefix_tokens(2) == 0


def test_can_admit_needs_only_the_missing_blocks() -> None:
    allocator = _prefix_allocator(96, 16, 128)  # 6 blocks
    assert allocator.admit(0, _group_request(0, 48, prefix=48), 48)  # 3 blocks, all shareable
    request = _group_request(1, 60, prefix=48)  # 4 blocks, 3 of them cached
    assert allocator.can_admit(request, 60)
    assert allocator.admit(1, request, 60)
    assert allocator.usage().free == 2 * 16


def test_a_freed_prefix_stays_cached_and_reviving_it_takes_free_blocks() -> None:
    allocator = _prefix_allocator(64, 16, 128)  # 4 blocks
    assert allocator.admit(0, _group_request(0, 48, prefix=48), 48)
    allocator.free(0)
    assert allocator.usage().free == 64  # cached free blocks count as free
    # 3 cached blocks plus 1 new one: the whole pool, although "only 1 is missing"
    assert allocator.can_admit(_group_request(1, 64, prefix=48), 64)
    assert not allocator.can_admit(_group_request(1, 80, prefix=48), 80)
    assert allocator.admit(1, _group_request(1, 64, prefix=48), 64)
    assert allocator.prefix_cache.cached_prefix_tokens(1) == 48
    assert allocator.prefix_cache.num_evicted_blocks == 0


def test_the_least_recently_freed_cached_block_is_evicted_first() -> None:
    allocator = _prefix_allocator(64, 16, 128)  # 4 blocks
    assert allocator.admit(0, _group_request(0, 32, prefix=32), 32)  # blocks 0, 1
    allocator.free(0)  # queue: 2, 3, then tail first: 1, 0
    assert allocator.admit(1, Request(1, 0.0, 48, 1), 48)  # takes 2, 3 and evicts 1
    assert allocator.block_table(1) == (2, 3, 1)
    assert allocator.prefix_cache.num_evicted_blocks == 1
    allocator.free(1)
    assert allocator.admit(2, _group_request(2, 32, prefix=32), 32)
    assert allocator.prefix_cache.cached_prefix_tokens(2) == 16  # block 0 survived, block 1 did not
    assert allocator.block_table(2)[0] == 0


def test_fork_shares_the_partial_block_until_either_sharer_writes() -> None:
    allocator = _prefix_allocator(128, 16, 128)
    assert allocator.admit(0, _group_request(0, 40), 40)
    assert allocator.fork(0, 1)
    assert allocator.prefix_cache.cached_prefix_tokens(1) == 0
    assert allocator.usage().shared_slots == 48
    assert allocator.append(0)
    assert allocator.take_copy_on_writes() == [(2, 3)]
    assert allocator.append(1)
    assert allocator.take_copy_on_writes() == []
    assert allocator.num_copy_on_writes == 1
    assert allocator.block_table(0) == (0, 1, 3)
    assert allocator.block_table(1) == (0, 1, 2)


def test_prompt_blocks_filled_by_appends_are_cached() -> None:
    allocator = _prefix_allocator(128, 16, 128)
    assert allocator.admit(0, _group_request(0, 50), 10)  # chunked: prefix not yet written
    assert allocator.append(0, 22)
    assert allocator.admit(1, _group_request(1, 50), 50)
    assert allocator.prefix_cache.cached_prefix_tokens(1) == 32


@pytest.mark.parametrize(
    ("block_size", "hash_block_tokens", "second_hashes", "num_shared"),
    [
        (16, 16, (1, 2, 9), 2),  # aligned: blocks before the differing hash block
        (8, 16, (1, 2, 9), 4),  # smaller blocks: two per hash block
        (16, 24, (1, 9), 1),  # block 1 straddles hash blocks 0 and 1
        (32, 8, (1, 2, 3, 9, 5, 6, 7, 8), 0),  # a 32-token block covers hash blocks 0..3
        (32, 8, (1, 2, 3, 4, 5, 6, 7, 9), 1),
    ],
)
def test_trace_hashes_map_onto_blocks_of_any_size(
    block_size: int, hash_block_tokens: int, second_hashes: tuple[int, ...], num_shared: int
) -> None:
    allocator = _prefix_allocator(1024, block_size, 256)
    first = _hashed_request((1, 2, 3, 4, 5, 6, 7, 8), hash_block_tokens, 64)
    known_tokens = min(64, len(second_hashes) * hash_block_tokens)
    second = _hashed_request(second_hashes, hash_block_tokens, known_tokens)
    assert allocator.admit(0, first, first.prompt_tokens)
    assert allocator.admit(1, second, second.prompt_tokens)
    assert allocator.prefix_cache.cached_prefix_tokens(1) == num_shared * block_size


def test_only_whole_known_prompt_blocks_get_hashes() -> None:
    assert len(prompt_block_hashes(_hashed_request((1, 2), 10, 100), 8)) == 2  # 20 known tokens
    assert len(prompt_block_hashes(_hashed_request((1, 2), 10, 15), 8)) == 1  # capped by prompt
    assert len(prompt_block_hashes(_group_request(0, 30, prefix=40), 8)) == 3
    assert prompt_block_hashes(Request(0, 0.0, 64, 1), 8) == ()
    with pytest.raises(ValueError):
        prompt_block_hashes(_hashed_request((1, 2), 0, 64), 8)


def test_hashes_are_chained_and_do_not_depend_on_the_hash_seed() -> None:
    request = _hashed_request((5, 6, 7), 16, 48)
    hashes = prompt_block_hashes(request, 16)
    assert hashes[1] != prompt_block_hashes(_hashed_request((4, 6, 7), 16, 48), 16)[1]
    script = (
        "from kvbench.allocators.prefix_hashes import prompt_block_hashes; "
        "from kvbench.core.request import Request; "
        "print(prompt_block_hashes(Request(0, 0.0, 48, 1, prefix_block_hashes=(5, 6, 7), "
        "hash_block_tokens=16), 16))"
    )
    for seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": seed}
        command = [sys.executable, "-c", script]
        output = subprocess.run(
            command, env=environment, capture_output=True, text=True, check=True
        ).stdout
        assert output.strip() == str(hashes)
