"""The radix prefix cache (SGLang's RadixAttention): hand-checkable trees, then properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.allocators import PagedAllocator, RadixAllocator, make_allocator
from kvbench.allocators.radix import common_prefix_tokens, known_token_runs, slice_runs
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate


def _group(request_id: int, prompt: int, group: int = 1, prefix: int | None = None) -> Request:
    return Request(request_id, 0.0, prompt, 4, prefix_group=group,
                   prefix_tokens=prompt if prefix is None else prefix)  # fmt: skip


def _hashed(request_id: int, hashes: tuple[int, ...], prompt: int, unit: int = 4) -> Request:
    return Request(request_id, 0.0, prompt, 4, prefix_block_hashes=hashes, hash_block_tokens=unit)


def test_runs_slice_and_compare_token_by_token() -> None:
    runs = known_token_runs(_hashed(0, (5, 6, 7), 10))  # 4 + 4 + 2 known tokens
    assert [run[2] for run in runs] == [4, 4, 2]
    assert slice_runs(runs, 3, 6) == [(runs[0][0], 3, 1), (runs[1][0], 0, 2)]
    other = known_token_runs(_hashed(1, (5, 6, 9), 12))
    assert common_prefix_tokens(runs, other) == 8
    assert common_prefix_tokens(slice_runs(runs, 0, 6), other) == 6
    assert common_prefix_tokens(runs, known_token_runs(_hashed(2, (6,), 4))) == 0


def test_insert_match_and_split() -> None:
    radix = RadixAllocator(200, 100)
    assert radix.admit(0, _group(0, 40), 41)  # 40 known tokens inserted, 1 own
    assert radix.cached_prefix_tokens(0) == 0
    assert radix.cached_tokens() == 40
    assert radix.admit(1, _group(1, 50), 51)  # its first 40 hit, 10 more inserted
    assert radix.cached_prefix_tokens(1) == 40
    assert radix.block_table(1)[:40] == radix.block_table(0)[:40]
    assert radix.cached_tokens() == 50
    # A shorter prefix of the group ends inside the first edge: the edge splits at 25.
    assert radix.admit(2, _group(2, 30, prefix=25), 31)
    assert radix.cached_prefix_tokens(2) == 25
    assert radix.block_table(2)[:25] == radix.block_table(0)[:25]
    assert radix.block_table(2)[25] not in radix.block_table(0)
    usage = radix.usage()
    # 50 cached tokens, shared: the first 25 by three sequences, the next 15 by two.
    assert usage.shared_slots == 40
    assert usage.saved_slots == 25 * 2 + 15
    assert usage.token_states == 41 + 51 + 31 - usage.saved_slots
    # Another group shares nothing.
    assert radix.match_tokens(_group(3, 30, group=2), 31) == 0


def test_trace_hashes_match_by_hash_and_offset_in_whole_pages() -> None:
    first, second = _hashed(0, (1, 2), 8), _hashed(1, (1, 3), 8)
    for page_tokens, expected_hit in ((1, 4), (2, 4), (4, 4), (8, 0)):
        radix = RadixAllocator(64, 100, page_tokens=page_tokens)
        assert radix.admit(0, first, 9)
        assert radix.admit(1, second, 9)
        assert radix.cached_prefix_tokens(1) == expected_hit
    # A prompt that ends inside a hash block still matches the tokens it has.
    radix = RadixAllocator(64, 100)
    assert radix.admit(0, _hashed(0, (1, 2), 6), 7)  # (1, 0..3), (2, 0..1)
    assert radix.match_tokens(_hashed(1, (1, 2), 8), 9) == 6
    assert radix.match_tokens(_hashed(2, (1, 2), 8), 5) == 5  # capped at its own length


def test_lru_leaf_eviction_keeps_parents_and_in_use_nodes() -> None:
    radix = RadixAllocator(20, 100)  # 20 pages of one token
    assert radix.admit(0, _group(0, 10, group=1), 10)  # group 1: 10 tokens, oldest
    radix.free(0)
    assert radix.admit(1, _group(1, 10, group=2), 10)  # group 2: 10 tokens
    radix.free(1)
    # Group 1's first 6 tokens are used again (a split): its 4-token tail is now the oldest leaf.
    assert radix.admit(2, _group(2, 6, group=1), 6)
    assert radix.cached_prefix_tokens(2) == 6
    radix.free(2)
    assert radix.usage().free == 20  # everything cached, nothing held
    assert radix.admit(3, Request(3, 0.0, 3, 4), 3)  # no prefix: 3 own pages, evicts the tail
    assert radix.num_evicted_pages == 4
    assert radix.match_tokens(_group(9, 10, group=1), 10) == 6
    assert radix.match_tokens(_group(9, 10, group=2), 10) == 10
    assert radix.admit(4, Request(4, 0.0, 8, 4), 8)  # 1 free page left: evicts group 2 next
    assert radix.match_tokens(_group(9, 10, group=2), 10) == 0
    assert radix.match_tokens(_group(9, 10, group=1), 10) == 6
    # A node in use is never evicted: group 1's 6 tokens, referenced, cannot make room.
    assert radix.admit(5, _group(5, 6, group=1), 6)
    assert radix.usage().free == 20 - 3 - 8 - 6  # the 3 pages group 2's eviction left over
    assert not radix.can_admit(Request(6, 0.0, 4, 4), 4)
    assert not radix.admit(6, Request(6, 0.0, 4, 4), 4)
    assert radix.match_tokens(_group(9, 10, group=1), 10) == 6


def test_a_finished_sequence_leaves_its_own_full_pages_cached_and_unmatched() -> None:
    radix = RadixAllocator(64, 100, page_tokens=4)
    assert radix.admit(0, _group(0, 10, prefix=8), 10)  # 8 known (2 pages) + 2 own tokens
    assert radix.append(0, 5)  # 7 own tokens: one full own page, one partial
    radix.free(0)
    assert radix.cached_tokens() == 8 + 4  # the partial page went back to the free list
    usage = radix.usage()
    assert usage.free == 64 and usage.token_states == 0
    assert radix.match_tokens(_group(1, 20), 20) == 8


def test_fork_shares_the_path_and_copies_its_own_pages() -> None:
    radix = RadixAllocator(40, 100)
    assert radix.admit(0, _group(0, 10, prefix=6), 12)
    assert radix.fork(0, 1)
    parent, child = radix.block_table(0), radix.block_table(1)
    assert child[:6] == parent[:6] and not set(child[6:]) & set(parent[6:])
    assert radix.take_copy_on_writes() == list(zip(parent[6:], child[6:], strict=True))
    assert radix.usage().shared_slots == 6
    assert radix.fork(1, 2) and radix.fork(2, 3) and radix.fork(3, 4)  # 6 + 5 x 6 = 36 of 40
    before = radix.usage()
    assert not radix.fork(4, 5)  # 6 more do not fit: no change
    assert radix.usage() == before and before.token_states == 36


def test_registry_and_config_build_it_with_its_page_size() -> None:
    radix = make_allocator("radix", 1000, 16, 256, radix_page_tokens=8)
    assert isinstance(radix, RadixAllocator)
    assert radix.block_size == 8
    assert make_allocator("radix", 1000, 16, 256).block_size == 1
    with pytest.raises(ValueError, match="page_tokens=0"):
        RadixAllocator(1000, 256, page_tokens=0)


# --- properties -------------------------------------------------------------------------------

_identities = st.one_of(
    st.fixed_dictionaries({"prefix_group": st.integers(0, 2), "prefix_tokens": st.integers(0, 40)}),
    st.fixed_dictionaries({
        "prefix_block_hashes": st.lists(st.integers(1, 3), min_size=1, max_size=8).map(tuple),
        "hash_block_tokens": st.sampled_from([3, 4, 8]),
    }),
)


def _token(request: Request, position: int) -> tuple[object, ...] | None:
    """The identity of the request's prompt token, independently of the allocator."""
    if request.prefix_block_hashes:
        unit = request.hash_block_tokens
        if position < min(request.prompt_tokens, len(request.prefix_block_hashes) * unit):
            return ("hash", request.prefix_block_hashes[position // unit], position % unit)
        return None
    if request.prefix_group is not None and position < min(
        request.prefix_tokens, request.prompt_tokens
    ):
        return ("group", request.prefix_group, position)
    return None


def _shared_prefix(first: Request, second: Request) -> int:
    length = 0
    while length < min(first.prompt_tokens, second.prompt_tokens):
        token = _token(first, length)
        if token is None or token != _token(second, length):
            break
        length += 1
    return length


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_tokens=st.sampled_from([1, 2, 4]),
    num_slots=st.integers(0, 120),
    operations=st.lists(
        st.tuples(st.booleans(), st.integers(1, 40), _identities, st.integers(0, 6)),
        max_size=30,
    ),
)
def test_cache_stays_in_the_pool_and_hits_never_exceed_the_true_shared_prefix(
    page_tokens: int, num_slots: int, operations: list
) -> None:
    radix = RadixAllocator(num_slots, 64, page_tokens=page_tokens)
    seen: list[Request] = []  # every request admitted so far (its known prompt was inserted)
    running: dict[int, Request] = {}
    for request_id, (free_one, prompt, identity, appended) in enumerate(operations):
        if free_one and running:
            radix.free(next(iter(running)))
            del running[next(iter(running))]
        request = Request(request_id, 0.0, prompt, 8, **identity)
        expected = radix.can_admit(request, prompt + 1)
        assert radix.admit(request_id, request, prompt + 1) == expected
        if expected:
            hit = radix.cached_prefix_tokens(request_id)
            best = max((_shared_prefix(request, earlier) for earlier in seen), default=0)
            assert hit % page_tokens == 0
            assert hit <= best // page_tokens * page_tokens
            seen.append(request)
            running[request_id] = request
            radix.append(request_id, appended)
        # The tree's tokens and the running sequences' own pages (those after the known
        # prompt, counted here independently) fit in the pool together.
        own_pages = 0
        for seq_id, seq_request in running.items():
            num_tokens = radix.num_tokens(seq_id)
            known = 0
            while known < num_tokens and _token(seq_request, known) is not None:
                known += 1
            own_pages += -(-num_tokens // page_tokens) - known // page_tokens
        assert radix.cached_tokens() + own_pages * page_tokens <= radix.num_pages * page_tokens
        usage = radix.usage()  # its categories add up to the pool (MemoryUsage checks it)
        assert usage.free == radix.num_free_blocks() * page_tokens
    for seq_id in running:
        radix.free(seq_id)
    assert radix.usage().free == radix.num_pages * page_tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_tokens=st.sampled_from([1, 2, 4, 8]),
    requests=st.lists(st.tuples(st.integers(1, 40), _identities), min_size=1, max_size=20),
)
def test_without_eviction_a_hit_is_the_longest_shared_prefix(
    page_tokens: int, requests: list
) -> None:
    radix = RadixAllocator(10_000, 64, page_tokens=page_tokens)
    seen: list[Request] = []
    for request_id, (prompt, identity) in enumerate(requests):
        request = Request(request_id, 0.0, prompt, 8, **identity)
        assert radix.admit(request_id, request, prompt + 1)
        best = max((_shared_prefix(request, earlier) for earlier in seen), default=0)
        assert radix.cached_prefix_tokens(request_id) == best // page_tokens * page_tokens
        seen.append(request)
        if request_id % 3 == 0:
            radix.free(request_id)  # cached, not evicted: the pool is large


def _conversation_requests(num_requests: int, seed: int) -> list[Request]:
    """Shared-prefix traffic: a few groups with long known prefixes, and trace hashes."""
    rng = random.Random(seed)
    requests = []
    for request_id in range(num_requests):
        prompt = rng.randint(20, 600)
        if rng.random() < 0.5:
            identity: dict = {"prefix_group": rng.randint(0, 4),
                              "prefix_tokens": rng.randint(0, prompt)}  # fmt: skip
        else:
            hashes = tuple(rng.randint(0, 3) if i < 2 else rng.randint(0, 30) for i in range(8))
            identity = {"prefix_block_hashes": hashes, "hash_block_tokens": 64}
        requests.append(Request(request_id, 0.05 * request_id, prompt, rng.randint(1, 60),
                                **identity))  # fmt: skip
    return requests


@pytest.mark.parametrize("page_tokens", [1, 16])
def test_radix_hits_what_block_hash_caching_hits_when_nothing_is_evicted(page_tokens) -> None:
    """On a pool that never evicts, radix with pages of P tokens and paged_prefix with blocks of
    P tokens find the same cached prefix for every request (two implementations, one answer)."""
    deployment = get_deployment("llama-3-8b", "a100-80gb")
    limits = SchedulerLimits(max_model_len=4096)
    requests = _conversation_requests(120, seed=page_tokens)
    cached = []
    for allocator in (RadixAllocator(2_000_000, 4096, page_tokens=page_tokens),
                      PagedAllocator(2_000_000, page_tokens, 4096, enable_prefix_caching=True)):
        result = simulate(requests, Scheduler(limits), allocator, RooflineCostModel(deployment))
        cached.append([record.cached_prompt_tokens for record in result.requests])
    assert cached[0] == cached[1]
    assert sum(cached[0]) > 0


def test_fast_and_step_by_step_runs_agree_under_eviction() -> None:
    deployment = get_deployment("llama-3-8b", "a100-80gb")
    limits = SchedulerLimits(max_model_len=4096)
    requests = _conversation_requests(150, seed=7)
    results = []
    for fast in (True, False):
        allocator = RadixAllocator(6_000, 4096)
        results.append(simulate(requests, Scheduler(limits), allocator,
                                RooflineCostModel(deployment), fast=fast))  # fmt: skip
        assert allocator.num_evicted_pages > 0
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_tokens=st.sampled_from([1, 2, 4, 16]),
    requests=st.lists(st.tuples(st.integers(1, 60), _identities), min_size=1, max_size=25),
)
def test_the_unbounded_tree_reaches_the_workloads_ideal(page_tokens: int, requests: list) -> None:
    """Two computations of an unbounded cache's hits (block contents vs the radix tree's runs)
    agree at every block size."""
    from kvbench.allocators.radix import unbounded_radix_hits
    from kvbench.workloads.prefix_reuse import ideal_prefix_reuse

    ordered = [Request(i, float(i), prompt, 8, **identity)
               for i, (prompt, identity) in enumerate(requests)]  # fmt: skip
    ideal = ideal_prefix_reuse(ordered, page_tokens)
    assert unbounded_radix_hits(ordered, page_tokens) == ideal.hit_tokens
