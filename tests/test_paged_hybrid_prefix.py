"""``paged_hybrid_prefix``: a prefix hit only where every KV-cache group hits (vLLM's hybrid
coordinator), on cases worked out by hand and against vLLM's own manager (``peer``).

The hand cases share one request A: an 8,000-token prompt whose tokens are all a known prefix,
then 100 decoded tokens, still running. A's first append (8,000 tokens computed) frees, in each
sliding group of window ``w``, the blocks wholly behind the window, ``(8,000 - w + 1) // 16`` of
them, pushed onto the free queue newest first; later appends free one block at a time. A request
C without a prefix then takes the never-used blocks and the first ``N`` of those freed ones
(evicting them), and B asks for A's first 6,000 tokens (375 blocks).
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


def _hybrid_prefix(model: str, num_blocks: int) -> PagedHybridAllocator:
    layout = kv_group_layout(get_model(model).layer_windows)
    num_slots = -(-num_blocks * BLOCK * layout.group_size // layout.num_model_layers)
    return PagedHybridAllocator(num_slots, BLOCK, 32768, layout=layout, num_blocks=num_blocks,
                                enable_prefix_caching=True)  # fmt: skip


def _run_a_then_evict(allocator: PagedHybridAllocator, num_c_blocks: int) -> None:
    """A admitted and decoded (still running); C, without a prefix, takes ``num_c_blocks``
    blocks per group."""
    assert allocator.admit(0, A, A.prompt_tokens)
    for _ in range(A.output_tokens):
        assert allocator.append(0, 1)
    assert allocator.prefix_cache is not None
    assert allocator.prefix_cache.match_tokens(B, B.prompt_tokens) == 6000  # all of it, before C
    c = Request(1, 0.0, num_c_blocks * BLOCK, 10)
    assert allocator.admit(1, c, c.prompt_tokens)


def test_mistral_shaped_a_prefix_shorter_than_the_window_hits_only_its_leading_cached_run() -> (
    None
):
    # One group, every layer sliding over 4,096 tokens: a hit needs the ceil(4,095 / 16) = 256
    # blocks before it. A frees blocks 0-243 at its first append, 244-249 later; it holds
    # 250-506. Pool: A's 507 blocks and 4 never used. C takes those 4 and the first N = 100
    # freed ones: blocks 243..144 of A's table. B's 375 blocks: 374-250 held and 249-244 cached
    # (131 contiguous), 243 evicted; below it 143-0, 144 < 256 blocks, a run from the prompt's
    # start, which vLLM counts as a hit: 144 blocks, where the evicted blocks begin.
    allocator = _hybrid_prefix("mistral-7b-v0.1", 507 + 4)
    _run_a_then_evict(allocator, 4 + 100)
    assert allocator.prefix_cache is not None
    assert allocator.prefix_cache.match_tokens(B, B.prompt_tokens) == 144 * BLOCK == 2304
    allocator.free(1)  # room for B; their blocks stay cached, B's hit is the same
    allocator.free(0)
    assert allocator.admit(2, B, B.prompt_tokens)
    assert allocator.prefix_cache.cached_prefix_tokens(2) == 2304
    [table] = allocator.group_tables(2)
    # The hit is shorter than the window: every hit block is referenced, none is null.
    assert None not in table and len(table) == 375
    assert all(allocator.ref_count(block) == 1 for block in table[:144])


def test_gemma_3_hits_only_where_the_sliding_groups_window_blocks_survive() -> None:
    # Gemma-3-27B: sliding groups 0-5 (window 1,024: a hit needs 64 blocks) and full group 6.
    # A's first append frees blocks 0-435 of each sliding group (group 0's first, newest first).
    # Pool: A's 7 x 507 blocks and 5 never used; C takes 15 blocks in each of 7 groups, 105: the
    # 5 and group 0's blocks 435..336. B: the full group holds all 375 of its blocks (A runs),
    # but group 0 lost 374-336, so the sliding groups' 64 contiguous blocks end at 336 (272-335):
    # 336 blocks, 5,376 tokens, where the full group alone would give 6,000.
    allocator = _hybrid_prefix("gemma-3-27b", 7 * 507 + 5)
    _run_a_then_evict(allocator, 15)
    assert allocator.prefix_cache is not None
    assert allocator.prefix_cache.match_tokens(B, B.prompt_tokens) == 336 * BLOCK == 5376
    assert allocator.admit(2, B, B.prompt_tokens)
    assert allocator.prefix_cache.cached_prefix_tokens(2) == 5376
    tables = allocator.group_tables(2)
    for sliding in tables[:6]:  # null before the window's 64 blocks, revived from the free queue
        assert sliding[:272] == (None,) * 272 and None not in sliding[272:]
        assert all(allocator.ref_count(block) == 1 for block in sliding[272:336])
    a_tables = allocator.group_tables(0)
    assert tables[6][:336] == a_tables[6][:336]  # the full group shares A's 336 blocks
    assert tables[6][336] != a_tables[6][336]  # and computes the rest itself
    usage = allocator.usage()
    # Shared (two references): the full group's 336 blocks (the sliding ones A had freed: B's
    # alone), blocks of 16 tokens x 10 layers, in slots of the model's 62 layers.
    assert usage.shared_slots == usage.saved_slots == 336 * BLOCK * 10 // 62


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

    assert longest_hybrid_hit(max_blocks, specs, is_cached) == expected


# --- against vLLM's own hybrid manager ---------------------------------------------------------

WINDOW_SETS = [
    (32, None),  # one sliding and one full group (vLLM's one-pass case)
    (48, 48, None),  # two groups of one window: looked up together
    (64,),  # every layer sliding (Mistral-like)
    (32, 80, None),  # two windows and full attention: the fixed point
]


def _random_workload(seed: int) -> tuple[list[Request], list[tuple]]:
    """Requests sharing prefixes of three groups, admitted, decoded and freed at random, at
    most three at a time. Prompts are never whole blocks, so kvbench's hit limit (the prompt's
    full blocks) is vLLM's (its tokens less one)."""
    rng = random.Random(seed)
    requests: list[Request] = []
    operations: list[tuple] = []
    live: list[int] = []
    for _ in range(60):
        if len(live) < 3 and (not live or rng.random() < 0.4):
            index = len(requests)
            prompt = rng.randrange(20, 200)
            prompt += prompt % BLOCK == 0
            requests.append(Request(index, 0.0, prompt, 60, prefix_group=rng.randrange(3),
                                    prefix_tokens=rng.randrange(0, 200)))  # fmt: skip
            operations.append(("admit", index))
            live.append(index)
        elif rng.random() < 0.7:
            operations.append(("decode", rng.choice(live), rng.randrange(1, 20)))
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
@pytest.mark.parametrize("windows", WINDOW_SETS)
@pytest.mark.parametrize("seed", range(3))
def test_hit_tokens_agree_with_vllms_hybrid_manager(windows: tuple, seed: int) -> None:
    from kvbench.referee.vllm_hybrid_prefix import vllm_hybrid_hit_tokens

    requests, operations = _random_workload(seed)
    # Three live requests of at most 199 + 60 x 20 tokens never exceed the pool; finished
    # requests' cached blocks are evicted many times over.
    num_blocks = 3 * len(windows) * 90
    ours = _kvbench_hit_tokens(windows, num_blocks, requests, operations)
    theirs = vllm_hybrid_hit_tokens(windows, BLOCK, num_blocks, requests, operations)
    assert ours == theirs
    assert sum(ours) > 0  # the workload does hit
