"""``paged_hybrid_prefix``: a prefix hit only where every KV-cache group hits (vLLM's hybrid
coordinator), with vLLM 0.32's sparse retention in the sliding groups, on cases worked out by hand
and against vLLM's own manager (``peer``).

The hand cases share one request A: an 8,000-token prompt whose tokens are all a known prefix
(group 1), then 100 decoded tokens, still running. A's replay boundary is 7,999 tokens, block
499: a full group caches all 500 prompt blocks; a sliding group of window ``w`` only the
``ceil((w - 1) / 16)`` blocks before block 499. A's first append frees, in each sliding group,
the blocks wholly behind the window, ``(8,000 - w + 1) // 16`` of them.
"""

from __future__ import annotations

import random

import pytest
from referee_support import peer

from kvbench.allocators import PagedHybridAllocator, make_allocator
from kvbench.allocators.hybrid_prefix import blocks_needed_for_hit, longest_hybrid_hit
from kvbench.core.catalog import get_model
from kvbench.core.kv_groups import kv_group_layout
from kvbench.core.request import Request

BLOCK = 16
A = Request(0, 0.0, 8000, 100, prefix_group=1, prefix_tokens=8000)
B = Request(2, 0.0, 6000, 10, prefix_group=1, prefix_tokens=6000)
# A longer sibling of A: its 8,000 tokens, then 500 of its own.
A_LONGER = Request(3, 0.0, 8500, 10, prefix_group=1, prefix_tokens=8000)


def _hybrid_prefix(model: str, num_blocks: int) -> PagedHybridAllocator:
    layout = kv_group_layout(get_model(model).layer_windows)
    num_slots = -(-num_blocks * BLOCK * layout.group_size // layout.num_model_layers)
    return PagedHybridAllocator(num_slots, BLOCK, 32768, layout=layout, num_blocks=num_blocks,
                                enable_prefix_caching=True)  # fmt: skip


def _run_a(allocator: PagedHybridAllocator) -> None:
    """A admitted and decoded, still running."""
    assert allocator.admit(0, A, A.prompt_tokens)
    for _ in range(A.output_tokens):
        assert allocator.append(0, 1)


def test_mistral_shaped_hits_only_at_a_prompts_replay_boundary() -> None:
    # One group, every layer sliding over 4,096 tokens: a hit needs the ceil(4,095 / 16) = 256
    # blocks before it. A keeps blocks 243-498 cached (blocks 243-249 freed behind the window,
    # cached free; 250-498 held). Pool: A's 507 blocks and 4 never used.
    allocator = _hybrid_prefix("mistral-7b-v0.1", 507 + 4)
    _run_a(allocator)
    cache = allocator.prefix_cache
    assert cache is not None
    # B's 6,000 tokens (a hit of at most 374 blocks, a token short) end inside A's prompt:
    # 243-373 is a run of 131 < 256 blocks, and block 0 is not cached (no run from the start): a
    # miss, where every block of A cached (dense retention) would give 5,984 tokens.
    assert cache.match_tokens(B, B.prompt_tokens) == 0
    # A longer sibling resumes at A's boundary: 256 blocks end at block 499.
    assert cache.match_tokens(A_LONGER, A_LONGER.prompt_tokens) == 499 * BLOCK == 7984
    # Evict the tail's first block (freed behind the window, a hashed block: at the free queue's
    # tail, after the unhashed ones): 244-498 is 255 blocks, and the hit is gone.
    queue = allocator.free_blocks()
    c = Request(1, 0.0, (queue.index(243) + 1) * BLOCK, 10)
    assert all(block not in queue[: queue.index(243)] for block in range(244, 250))
    assert allocator.admit(1, c, c.prompt_tokens)
    assert cache.match_tokens(A_LONGER, A_LONGER.prompt_tokens) == 0


def test_gemma_3_a_shared_prefix_misses_once_then_hits_at_its_pinned_junction() -> None:
    # Gemma-3-27B: sliding groups 0-5 (window 1,024: a hit needs 64 blocks) and full group 6.
    allocator = _hybrid_prefix("gemma-3-27b", 7 * 507 + 2 * 7 * 440)
    _run_a(allocator)
    cache = allocator.prefix_cache
    assert cache is not None
    # B1 shares A's first 6,000 tokens (375 blocks) and adds 8: the full group serves all 375,
    # the sliding groups none (A keeps 435-498 only): no hit, and a junction at block 375.
    b1 = Request(4, 0.0, 6008, 10, prefix_group=1, prefix_tokens=6000)
    hit = cache.lookup(b1, b1.prompt_tokens)
    assert (hit.num_blocks, hit.junction_blocks) == (0, 375)
    assert allocator.admit(4, b1, b1.prompt_tokens)
    assert cache.cached_prefix_tokens(4) == 0
    # B1 keeps its sliding blocks 311-374 (before the junction, and before its own replay
    # boundary, 6,007 tokens: block 375): B2, sharing the same 6,000 tokens, hits all of them.
    b2 = Request(5, 0.0, 7000, 10, prefix_group=1, prefix_tokens=6000)
    assert allocator.admit(5, b2, b2.prompt_tokens)
    assert cache.cached_prefix_tokens(5) == 6000
    b1_tables, b2_tables = allocator.group_tables(4), allocator.group_tables(5)
    for group in range(6):  # null before the window's 64 blocks, B1's blocks after
        assert b2_tables[group][:311] == (None,) * 311
        assert b2_tables[group][311:375] == b1_tables[group][311:375]
    a_full = allocator.group_tables(0)[6]
    assert b2_tables[6][:375] == a_full[:375]  # the full group: A's blocks, the first cached


def test_a_hit_is_capped_one_token_short_of_the_prompt() -> None:
    # A resend of a whole-block prompt recomputes its last token, so its last block: 7 blocks of
    # 128 tokens hit 6 (vLLM's max_cache_hit_length = num_tokens - 1).
    layout = kv_group_layout([None])
    allocator = PagedHybridAllocator(64 * BLOCK, BLOCK, 4096, layout=layout, num_blocks=64,
                                     enable_prefix_caching=True)  # fmt: skip
    first = Request(0, 0.0, 112, 5, prefix_group=0, prefix_tokens=112)
    resend = Request(1, 0.0, 112, 5, prefix_group=0, prefix_tokens=112)
    assert allocator.admit(0, first, 112)
    assert allocator.prefix_cache is not None
    assert allocator.prefix_cache.match_tokens(resend, 112) == 6 * BLOCK
    # The v0 engine admits a prompt with a slot for its first token: then all 7 blocks hit.
    assert allocator.prefix_cache.match_tokens(resend, 113) == 7 * BLOCK


def test_three_requests_sharing_a_prefix_hit_on_the_third() -> None:
    # Windows (32, full), blocks of 16: a sliding hit needs 2 blocks. A (100 tokens) keeps its
    # sliding blocks 4-5; B (90) shares 64 tokens: the full group hits 4 blocks, the sliding one
    # none (a miss, junction at block 4, B keeps 2-3); C (80) hits 64.
    hits = _kvbench_hit_tokens((32, None), 60, *_sharing_trio())
    assert hits == [0, 0, 64]


def _sharing_trio() -> tuple[list[Request], list[tuple]]:
    requests = [Request(index, 0.0, prompt, 4, prefix_group=0, prefix_tokens=64)
                for index, prompt in enumerate((100, 90, 80))]  # fmt: skip
    operations = [("admit", 0), ("decode", 0, 4), ("free", 0), ("admit", 1), ("decode", 1, 4),
                  ("free", 1), ("admit", 2)]  # fmt: skip
    return requests, operations


def test_without_prefix_caching_nothing_is_shared() -> None:
    allocator = make_allocator("paged_hybrid", 20_000, BLOCK, 32768)
    assert allocator.prefix_cache is None
    assert allocator.admit(0, A, 8000) and allocator.admit(1, B, 6000)
    assert allocator.usage().shared_slots == 0


@pytest.mark.parametrize(
    ("cached", "max_blocks", "expected"),
    [
        # Full attention (blocks 0-4 cached) and a sliding spec needing 2 blocks: the window's
        # run ends at 4 (blocks 2-3), not 5 (block 4 is missing in the sliding groups).
        ({0: set(range(5)), 1: {2, 3, 5}}, 8, 4),
        # No 2-block run: only the run from block 0 (block 0 alone) counts.
        ({0: set(range(5)), 1: {0, 2, 4}}, 8, 1),
        # The sliding run is longer than the full one: full attention bounds it.
        ({0: {0, 1}, 1: set(range(8))}, 8, 2),
    ],
)
def test_longest_hybrid_hit_by_hand(cached: dict[int, set[int]], max_blocks: int,
                                    expected: int) -> None:  # fmt: skip
    specs = [(None, [0]), (blocks_needed_for_hit(32, BLOCK), [1])]
    assert specs[1][0] == 2  # ceil(31 / 16)

    def is_cached(block: int, groups: object) -> bool:
        return all(block in cached[group] for group in groups)  # type: ignore[attr-defined]

    hit, longest = longest_hybrid_hit(max_blocks, specs, is_cached)
    assert hit == expected
    assert longest == max(run for run in range(max_blocks + 1)
                          if all(block in cached[0] for block in range(run)))  # fmt: skip


# --- against vLLM's own hybrid manager ---------------------------------------------------------

WINDOW_SETS = [
    (32, None),  # one sliding and one full group (vLLM's one-pass case)
    (48, 48, None),  # two groups of one window: looked up together
    (64,),  # every layer sliding (Mistral-like)
    (32, 80, None),  # two windows and full attention: the fixed point
]


# (prompts below, decode tokens per operation below, operations, pool blocks per group and live
# request): a loose pool, where finished requests' cached blocks are evicted many times over,
# and a tight one, where which free block goes first decides what is evicted (vLLM reuses the
# blocks it holds no hash for first: a queue in freeing order misses 88 of 160 such workloads).
POOLS = {"loose": (200, 20, 60, 90), "tight": (120, 6, 80, 14)}


def _random_workload(seed: int, pool: str) -> tuple[list[Request], list[tuple]]:
    """Requests sharing prefixes of three groups, admitted, decoded and freed at random, at
    most three at a time; some prompts end on a block boundary (the hit stops a token short)."""
    max_prompt, max_decode, num_operations, _ = POOLS[pool]
    rng = random.Random(seed)
    requests: list[Request] = []
    operations: list[tuple] = []
    live: list[int] = []
    for _ in range(num_operations):
        if len(live) < 3 and (not live or rng.random() < 0.4):
            index = len(requests)
            prompt = rng.choice((rng.randrange(20, max_prompt), BLOCK * rng.randrange(2, 7)))
            requests.append(Request(index, 0.0, prompt, 60, prefix_group=rng.randrange(3),
                                    prefix_tokens=rng.randrange(0, max_prompt)))  # fmt: skip
            operations.append(("admit", index))
            live.append(index)
        elif rng.random() < 0.7:
            operations.append(("decode", rng.choice(live), rng.randrange(1, max_decode)))
        else:
            index = live.pop(rng.randrange(len(live)))
            operations.append(("free", index))
    return requests, operations


def _kvbench_hit_tokens(windows: tuple, num_blocks: int, requests: list[Request],
                        operations: list[tuple]) -> list[int]:  # fmt: skip
    layout = kv_group_layout(list(windows))
    allocator = PagedHybridAllocator(num_blocks * BLOCK, BLOCK, 4096, layout=layout,
                                     num_blocks=num_blocks, enable_prefix_caching=True)  # fmt: skip
    assert allocator.prefix_cache is not None
    hits = []
    for operation in operations:
        kind, index = operation[0], operation[1]
        if kind == "admit":
            assert allocator.admit(index, requests[index], requests[index].prompt_tokens)
            hits.append(allocator.prefix_cache.cached_prefix_tokens(index))
        elif kind == "decode":
            for _ in range(operation[2]):
                assert allocator.append(index, 1)
        else:
            allocator.free(index)
    return hits


@peer
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("windows", WINDOW_SETS)
@pytest.mark.parametrize("seed", range(3))
def test_hit_tokens_agree_with_vllms_hybrid_manager(windows: tuple, seed: int, pool: str) -> None:
    from kvbench.referee.vllm_hybrid_prefix import vllm_hybrid_hit_tokens

    requests, operations = _random_workload(seed, pool)
    # Three live requests never exceed the pool (every admission and decode fits).
    num_blocks = 3 * len(windows) * POOLS[pool][3]
    ours = _kvbench_hit_tokens(windows, num_blocks, requests, operations)
    theirs = vllm_hybrid_hit_tokens(windows, BLOCK, num_blocks, requests, operations)
    assert ours == theirs
    assert sum(ours) > 0  # the workload does hit


@peer
def test_vllm_also_hits_the_shared_prefix_on_the_third_request() -> None:
    from kvbench.referee.vllm_hybrid_prefix import vllm_hybrid_hit_tokens

    assert vllm_hybrid_hit_tokens((32, None), BLOCK, 60, *_sharing_trio()) == [0, 0, 64]
