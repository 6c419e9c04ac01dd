"""The ideal prefix-cache hit rate of a workload, and LRU reuse distances (pure, from requests)."""

from __future__ import annotations

import random

import pytest

from kvbench.allocators import PagedAllocator
from kvbench.core.request import Request
from kvbench.workloads import load_trace, to_requests
from kvbench.workloads.prefix_reuse import (
    block_contents,
    has_prefix_identity,
    ideal_prefix_reuse,
    lru_reuse_distances,
)


def _hashed(request_id: int, hashes: tuple[int, ...], prompt: int, unit: int = 4,
            arrival_s: float | None = None) -> Request:  # fmt: skip
    arrival = float(request_id) if arrival_s is None else arrival_s
    return Request(request_id, arrival, prompt, 1, prefix_block_hashes=hashes,
                   hash_block_tokens=unit)  # fmt: skip


def test_a_shared_prefix_is_reused_up_to_the_first_miss():
    requests = [_hashed(0, (1, 2, 3), 12), _hashed(1, (1, 2, 4), 12), _hashed(2, (9, 2, 3), 12)]
    reuse = ideal_prefix_reuse(requests, 4)
    # request 1 reuses blocks 1, 2; request 2 starts with an unseen block, so its 2, 3 (same
    # hash ids after a different prefix) are not reusable
    assert (reuse.hit_blocks, reuse.hit_tokens) == (2, 8)
    assert (reuse.prompt_blocks, reuse.prompt_tokens) == (9, 36)
    assert reuse.token_hit_rate == pytest.approx(8 / 36)
    assert reuse.block_hit_rate == pytest.approx(2 / 9)


def test_block_sizes_smaller_larger_and_straddling_the_trace_blocks():
    requests = [_hashed(0, (1, 2, 3), 12), _hashed(1, (1, 2, 4), 11)]
    assert ideal_prefix_reuse(requests, 2).hit_blocks == 4  # 2 per trace block
    assert ideal_prefix_reuse(requests, 8).hit_blocks == 1  # [0, 8) = all of blocks 1 and 2
    straddle = ideal_prefix_reuse(requests, 6)  # [0, 6) = 1 + half of 2; [6, 12) = 2 + 3/4
    assert straddle.hit_blocks == 1 and straddle.prompt_blocks == 2 + 2
    assert block_contents(requests[0], 6) == [(1, 1, 0, 4, 2, 0, 2), (1, 2, 2, 2, 3, 0, 4)]
    assert len(block_contents(requests[1], 6)) == 1  # 11 tokens: one full block of 6


def test_a_partial_last_trace_block_never_makes_a_full_block():
    requests = [_hashed(0, (1, 2), 6), _hashed(1, (1, 2), 6)]  # block 2 holds 2 tokens
    reuse = ideal_prefix_reuse(requests, 4)
    assert reuse.hit_blocks == 1 and reuse.prompt_blocks == 4


def test_requests_are_taken_in_arrival_order():
    late_first = [_hashed(0, (1, 2), 8, arrival_s=5.0), _hashed(1, (1, 2), 8, arrival_s=1.0)]
    assert ideal_prefix_reuse(late_first, 4).hit_blocks == 2


def test_prefix_groups_share_their_prefix_and_plain_requests_nothing():
    group = [Request(i, float(i), 30, 1, prefix_group=7, prefix_tokens=10) for i in range(3)]
    reuse = ideal_prefix_reuse(group, 4)
    assert reuse.hit_blocks == 2 * 2  # 10 // 4 = 2 shareable blocks, the first request misses
    plain = [Request(i, float(i), 30, 1) for i in range(3)]
    assert not has_prefix_identity(plain) and has_prefix_identity(group)
    assert ideal_prefix_reuse(plain, 4).hit_blocks == 0


def test_it_matches_an_unbounded_paged_prefix_allocator_on_random_conversations():
    rng = random.Random(3)
    requests, next_hash = [], 100
    for request_id in range(200):
        if requests and rng.random() < 0.6:  # a later turn or a sibling of an earlier request
            parent = rng.choice(requests).prefix_block_hashes
            hashes = parent[: rng.randint(1, len(parent))]
        else:
            hashes = ()
        extra = rng.randint(0 if hashes else 1, 4)
        hashes += tuple(range(next_hash, next_hash + extra))
        next_hash += extra
        prompt = (len(hashes) - 1) * 32 + rng.randint(1, 32)
        requests.append(_hashed(request_id, hashes, prompt, unit=32))
    for block_size in (4, 16, 32, 64):
        allocator = PagedAllocator(10**6, block_size, 10**4, enable_prefix_caching=True)
        for request in requests:  # admit and free in arrival order: freed blocks stay cached
            assert allocator.admit(request.request_id, request, request.prompt_tokens)
            allocator.free(request.request_id)
        prefix_cache = allocator.prefix_cache
        assert prefix_cache is not None
        assert prefix_cache.num_evicted_blocks == 0
        assert ideal_prefix_reuse(requests, block_size).hit_blocks == prefix_cache.num_hit_blocks


def test_lru_reuse_distance_counts_distinct_blocks_touched_since_the_last_touch():
    requests = [_hashed(0, (1, 2), 8), _hashed(1, (3,), 4), _hashed(2, (1, 2), 8),
                _hashed(3, (1, 2), 8)]  # fmt: skip
    # request 2: block 1 was last touched before 2 and 3; block 2 before 3 and 1 (just now);
    # request 3: each block again 1 other block since its last touch
    assert lru_reuse_distances(requests, 4).tolist() == [8, 8, 4, 4]


def test_the_mooncake_trace_repeats_366_permille_of_its_blocks(shared_traces):
    trace = load_trace(shared_traces / "mooncake" / "conversation_trace.jsonl")
    if "arrival_s" not in trace.columns:
        pytest.skip("load_trace gave no arrival times")
    reuse = ideal_prefix_reuse(to_requests(trace), 512)
    # the trace card's figure: 36.6 % of the 512-token prompt blocks repeat an earlier block
    # (hash ids are chained, so every repeated block lies in a repeated prefix)
    assert reuse.block_hit_rate == pytest.approx(0.3664, abs=5e-4)
    assert reuse.token_hit_rate == pytest.approx(0.3736, abs=5e-4)
