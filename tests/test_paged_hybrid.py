"""``paged_hybrid``: vLLM v1's hybrid KV-cache manager, on cases worked out by hand, and grown
one slot ahead (the vLLM-v0 engine's way) beside vLLM's own manager (``peer``).

The issue's case: a Mistral-7B-v0.1-shaped model (every layer slides over 4,096 tokens) and one
request of 8,000 prompt + 100 output tokens. After its last append the sequence holds 8,100
tokens, 8,099 of them computed: a sliding layer needs tokens from 8,099 - 4,096 + 1 = 4,004 on,
so blocks 0-249 (tokens 0-3,999) are freed and blocks 250-506 stay: 257 blocks of 16 = 4,112
token slots per layer, at most the window plus two blocks (4,128), where ``paged`` (every layer
keeps every token) holds ceil(8,100 / 16) = 507 blocks, 8,112 slots, for the 8,100 tokens.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referee_support import peer

from kvbench.allocators import PagedHybridAllocator, make_allocator
from kvbench.core.catalog import get_deployment, get_model
from kvbench.core.kv_capacity import hybrid_pool
from kvbench.core.kv_groups import KvCacheGroup, KvGroupLayout, kv_group_layout
from kvbench.core.request import Request
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate

BLOCK = 16
PROMPT, OUTPUT = 8000, 100
REQUEST = Request(0, 0.0, PROMPT, OUTPUT)


def hybrid_over(num_blocks: int, block_size: int, layout: KvGroupLayout, max_model_len: int,
                **kwargs: bool) -> PagedHybridAllocator:  # fmt: skip
    """``paged_hybrid`` over ``num_blocks`` blocks, its slots what they hold of the model."""
    num_slots = -(-num_blocks * block_size * layout.group_size // layout.num_model_layers)
    return PagedHybridAllocator(num_slots, block_size, max_model_len, layout=layout,
                                num_blocks=num_blocks, **kwargs)  # fmt: skip


def random_layout(rng: random.Random) -> KvGroupLayout:
    """Full and sliding groups (windows of 3-100 tokens), with padding layers or not."""
    windows = rng.choice([(None, 8), (None, 32), (16, None, 40), (5,), (None, 3, 100),
                          (64, 64, None)])  # fmt: skip
    group_size = rng.choice([1, 2])
    groups = tuple(KvCacheGroup(window, rng.randint(1, group_size)) for window in windows)
    num_layers = sum(group.num_layers for group in groups)
    return KvGroupLayout(groups, group_size=group_size, num_model_layers=num_layers)


def count_cohort_rounds(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """From now on, count what the decode cohort's rounds do (``HybridDecodeCohort``): members
    freeing blocks behind a window, starting blocks, joining with blocks to free off their
    phases (a catch-up after a prefill)."""
    from kvbench.allocators.hybrid_cohort import HybridDecodeCohort

    counts: Counter[str] = Counter()
    act = HybridDecodeCohort._act
    join = HybridDecodeCohort.join

    def counted_act(self, member, num_tokens):  # type: ignore[no-untyped-def]
        first_live = list(member.seq.first_live)
        num_blocks = len(member.seq.tables[0])
        act(self, member, num_tokens)
        counts["freeing"] += member.seq.first_live != first_live
        counts["starting"] += len(member.seq.tables[0]) > num_blocks

    def counted_join(self, seq_id, seq, num_unprocessed_tokens):  # type: ignore[no-untyped-def]
        join(self, seq_id, seq, num_unprocessed_tokens)
        counts["catching_up"] += seq_id in self._first_round

    monkeypatch.setattr(HybridDecodeCohort, "_act", counted_act)
    monkeypatch.setattr(HybridDecodeCohort, "join", counted_join)
    return counts


def _hybrid(model: str, num_blocks: int = 4000) -> PagedHybridAllocator:
    """``paged_hybrid`` for the catalog model's groups over ``num_blocks`` blocks."""
    return hybrid_over(num_blocks, BLOCK, kv_group_layout(get_model(model).layer_windows), 32768)


def _run_request(allocator) -> None:  # type: ignore[no-untyped-def]
    assert allocator.admit(0, REQUEST, PROMPT)
    for _ in range(OUTPUT):
        assert allocator.append(0, 1)


def test_mistral_shaped_holds_the_window_plus_at_most_two_blocks_where_paged_holds_all() -> None:
    hybrid = _hybrid("mistral-7b-v0.1")
    _run_request(hybrid)
    [held_tokens] = hybrid.group_held_tokens(0)
    assert held_tokens == 257 * BLOCK == 4112
    assert held_tokens <= 4096 + 2 * BLOCK
    [table] = hybrid.group_tables(0)
    assert table[:250] == (None,) * 250 and None not in table[250:] and len(table) == 507
    # One group of all 32 layers: a block is 16 slots of the whole model.
    assert hybrid.held_slots(0) == 4112
    usage = hybrid.usage()
    # Blocks 250-506 hold tokens 4,000-8,099; the last block's 12 unfilled slots will never be
    # filled (the request is at its final length).
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (4100, 0, 12)

    paged = make_allocator("paged", 4000 * BLOCK, BLOCK, 32768)
    _run_request(paged)
    assert paged.held_slots(0) == 507 * BLOCK == 8112
    assert paged.usage().token_states == PROMPT + OUTPUT


@pytest.mark.parametrize(
    ("model", "window", "sliding_blocks"),
    [
        # Gemma-2-9B: 21 sliding (4,096) and 21 full layers, 1:1.
        ("gemma-2-9b", 4096, 257),
        # Gemma-3-27B: 52 sliding (1,024) and 10 full, 5:1; 8,099 - 1,024 + 1 = 7,076 tokens
        # behind the window: blocks 0-441 freed, 442-506 held: 65 blocks.
        ("gemma-3-27b", 1024, 65),
    ],
)
def test_a_gemma_mix_frees_only_the_sliding_groups_blocks(
    model: str, window: int, sliding_blocks: int
) -> None:
    hybrid = _hybrid(model)
    _run_request(hybrid)
    layout = hybrid.layout
    for group, held_tokens in zip(layout.groups, hybrid.group_held_tokens(0), strict=True):
        if group.window_tokens is None:
            assert held_tokens == 507 * BLOCK  # a full layer keeps all 8,100 tokens
        else:
            assert held_tokens == sliding_blocks * BLOCK <= window + 2 * BLOCK
    num_live_blocks = sum(hybrid.group_held_tokens(0)) // BLOCK
    live_layer_slots = num_live_blocks * BLOCK * layout.group_size
    assert hybrid.held_slots(0) == -(-live_layer_slots // layout.num_model_layers)


def test_gemma_2s_held_slots_by_hand() -> None:
    # 507 full + 257 sliding blocks, each 16 tokens x 21 layers of 42: 764 x 8 = 6,112 slots of
    # the whole model, against paged's 8,112.
    hybrid = _hybrid("gemma-2-9b")
    _run_request(hybrid)
    assert hybrid.held_slots(0) == 6112
    usage = hybrid.usage()
    # Full layers hold 8,100 tokens, sliding ones tokens 4,000-8,099: (8,100 + 4,100) / 2.
    assert usage.token_states == 6100
    assert usage.internal_frag == 12  # the last block's unfilled slots in both groups, halved


def test_freed_blocks_admit_more_requests_than_uniform_paging() -> None:
    # A pool of 600 blocks after the 8,100-token request: paged holds 507 blocks, 93 free;
    # paged_hybrid on the Mistral shape holds 257, 343 free: a 5,000-token prompt (313 blocks)
    # fits there and not in paged.
    hybrid = _hybrid("mistral-7b-v0.1", num_blocks=600)
    paged = make_allocator("paged", 600 * BLOCK, BLOCK, 32768)
    second = Request(1, 0.0, 5000, 10)
    for allocator in (hybrid, paged):
        _run_request(allocator)
    assert hybrid.num_free_blocks() == 600 - 257
    assert hybrid.can_admit(second, 5000)
    assert not paged.can_admit(second, 5000)


def test_a_fork_shares_every_group_and_copies_a_shared_partial_block_on_write() -> None:
    hybrid = _hybrid("gemma-2-9b", num_blocks=100)
    assert hybrid.admit(0, Request(0, 0.0, 40, 8), 40)  # 3 blocks per group, the last partial
    assert hybrid.fork(0, 1)
    assert hybrid.num_free_blocks() == 100 - 6
    assert hybrid.append(1, 1)
    copies = hybrid.take_copy_on_writes()
    assert len(copies) == 2  # one per group: each group's partial last block was shared
    assert hybrid.num_free_blocks() == 100 - 8
    hybrid.free(0)
    hybrid.free(1)
    assert hybrid.num_free_blocks() == 100
    usage = hybrid.usage()
    assert usage.token_states == usage.reservation == usage.internal_frag == 0


def test_a_failed_append_changes_nothing_and_counts_the_blocks_it_would_free() -> None:
    # Window 4 tokens, blocks of 2, one sliding layer: at 6 tokens computed, the 7th attends to
    # tokens 3-6, so block 0 (tokens 0-1) is freed before the append takes a new block.
    layout = kv_group_layout([4])
    hybrid = PagedHybridAllocator(6, 2, 64, layout=layout, num_blocks=3)
    assert hybrid.admit(0, Request(0, 0.0, 6, 10), 6)  # all 3 blocks
    assert hybrid.num_free_blocks() == 0
    assert hybrid.can_append(0, 1)  # block 0 comes back first
    assert hybrid.append(0, 1)
    assert hybrid.group_tables(0) == ((None, 1, 2, 0),)
    # Two more tokens need a block while only block 1 (tokens 2-3) leaves the window: 7 - 4 + 1
    # = 4 tokens behind, 2 blocks, of which block 0's entry is already freed.
    assert hybrid.append(0, 1)
    assert hybrid.group_tables(0) == ((None, None, 2, 0),)
    assert hybrid.num_free_blocks() == 1
    before = (hybrid.usage(), hybrid.group_tables(0))
    # 13 tokens take 7 table entries, 3 more than now; 1 block is free and none leaves the
    # window (8 - 4 + 1 = 5 tokens behind it: still 2 blocks).
    assert not hybrid.can_append(0, 5)
    assert not hybrid.append(0, 5)
    assert (hybrid.usage(), hybrid.group_tables(0)) == before


def test_the_v0_engines_slot_ahead_keeps_the_block_a_step_still_reads() -> None:
    # Window 4 tokens, blocks of 2, one sliding layer. The v0 engine admits a 5-token prompt with
    # a slot for the token its prefill samples (6 slots, blocks 0-2), and each decode step adds
    # the slot of the token it samples while it computes the K/V of the one before: the second
    # step (6 slots held) computes position 5, which attends to positions 2-5, so block 1
    # (positions 2-3) stays and only block 0 (0-1) is freed. Placed after all 6 held tokens, the
    # window would free block 1 too while that step still reads position 3.
    layout = kv_group_layout([4])
    tables = {}
    for ahead in (True, False):
        hybrid = PagedHybridAllocator(20, 2, 64, layout=layout, num_blocks=10,
                                      generated_slot_ahead=ahead)  # fmt: skip
        assert hybrid.admit(0, Request(0, 0.0, 5, 10), 5 + 1)
        assert hybrid.append(0, 1)  # computes position 5: attends to 2-5
        assert hybrid.append(0, 1)  # computes position 6: attends to 3-6
        tables[ahead] = hybrid.group_tables(0)
    assert tables[True] == ((None, 1, 2, 3),)
    assert tables[False] == ((None, None, 2, 3),)


@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 12), block_size=st.integers(1, 4), prompt=st.integers(1, 30),
       num_steps=st.integers(1, 30))  # fmt: skip
def test_a_v0_growth_frees_exactly_the_blocks_behind_the_step_s_attention(
    window: int, block_size: int, prompt: int, num_steps: int
) -> None:
    """Each v0 decode step computes the K/V of its sequence's last held token but one (the
    position before the slot it adds) and attends to the ``window`` positions up to it: every
    block holding one of them stays live, and every block wholly before them is freed."""
    layout = kv_group_layout([window])
    hybrid = PagedHybridAllocator(200 * block_size, block_size, 4096, layout=layout,
                                  num_blocks=200, generated_slot_ahead=True)  # fmt: skip
    assert hybrid.admit(0, Request(0, 0.0, prompt, num_steps), prompt + 1)
    for _ in range(num_steps):
        position = hybrid.num_tokens(0) - 1  # the token this step computes
        assert hybrid.append(0, 1)
        first_read = max(0, position - window + 1)
        [table] = hybrid.group_tables(0)
        live = [index for index, block in enumerate(table) if block is not None]
        assert live[0] == first_read // block_size
        assert live == list(range(live[0], len(table)))


def test_hybrid_pool_sizes_the_allocator_the_registry_builds() -> None:
    deployment = get_deployment("gemma-3-27b", "h100-80gb", num_gpus=2, kv_cache_gib=10)
    pool = hybrid_pool(deployment, BLOCK, None)
    allocator = make_allocator("paged_hybrid", deployment.num_kv_slots, BLOCK, 131072,
                               hybrid_pool=pool)  # fmt: skip
    assert isinstance(allocator, PagedHybridAllocator)
    assert allocator.num_free_blocks() == pool.num_blocks == 8192
    usage = allocator.usage()
    assert usage.num_slots == pool.num_slots
    # An empty pool: its blocks are free (8,192 x 16 x 10 / 62 = 21,140.6 slots, rounded to
    # whole slots with the rest), the fraction of a block past them is external.
    assert abs(usage.free - 8192 * BLOCK * 10 / 62) < 1
    assert usage.free + usage.external_frag == pool.num_slots


@peer
@pytest.mark.parametrize("seed", range(40))
def test_a_slot_ahead_growth_frees_as_vllm_does_with_a_lookahead_slot(seed: int) -> None:
    from kvbench.referee.vllm_hybrid_prefix import vllm_slot_ahead_tables

    rng = random.Random(seed)
    windows = [rng.randint(1, 12) for _ in range(rng.randint(1, 2))] + [None] * rng.randint(0, 1)
    block_size, prompt, num_steps = rng.randint(1, 4), rng.randint(1, 30), rng.randint(1, 30)
    hybrid = PagedHybridAllocator(1000 * block_size, block_size, 4096,
                                  layout=kv_group_layout(windows), num_blocks=1000,
                                  generated_slot_ahead=True)  # fmt: skip
    assert hybrid.admit(0, Request(0, 0.0, prompt, num_steps), prompt + 1)
    ours = [_live_entries(hybrid)]
    for _ in range(num_steps):
        assert hybrid.append(0, 1)
        ours.append(_live_entries(hybrid))
    # vLLM gets kvbench's groups (layers of one window grouped as vLLM groups them), a spec each.
    theirs = vllm_slot_ahead_tables(_group_windows(hybrid), block_size, prompt, num_steps)
    assert ours == theirs


def _live_entries(hybrid: PagedHybridAllocator) -> tuple[tuple[bool, ...], ...]:
    return tuple(tuple(block is not None for block in table)
                 for table in hybrid.group_tables(0))  # fmt: skip


def _group_windows(hybrid: PagedHybridAllocator) -> list[int | None]:
    return [group.window_tokens for group in hybrid.layout.groups]


@pytest.mark.parametrize(("scheduler", "num_sliding_blocks"), [("vllm_v0", 9), ("vllm_v1", 8)])
def test_runs_under_the_v0_engine_hold_a_generated_slot_ahead(
    scheduler: str, num_sliding_blocks: int
) -> None:
    from conftest import compose_config

    from kvbench.tasks.simulate.experiment import allocator_for

    # gpt-oss-20b: a full group and one sliding over 128 tokens, blocks of 16. 159 slots held,
    # one more added: the v0 engine computes position 158 (attending to 31-158: block 1 on),
    # vLLM v1 position 159 (32-159: block 2 on); blocks 1-9 or 2-9 live.
    cfg, deployment, _ = compose_config("model=gpt-oss-20b", "hardware=h100-80gb",
                                        f"scheduler={scheduler}", "allocators=[paged_hybrid]")
    pool = hybrid_pool(deployment, cfg.allocator.block_size, None)
    allocator = allocator_for(cfg, deployment, "paged_hybrid", deployment.num_kv_slots, pool)
    assert isinstance(allocator, PagedHybridAllocator)
    assert allocator.admit(0, Request(0, 0.0, 158, 10), 159)
    assert allocator.append(0, 1)
    sliding = [group.window_tokens is not None for group in allocator.layout.groups]
    held = dict(zip(sliding, allocator.group_held_tokens(0), strict=True))
    assert held == {False: 10 * BLOCK, True: num_sliding_blocks * BLOCK}


def test_the_engine_records_the_held_slots_at_the_requests_end() -> None:
    deployment = get_deployment("mistral-7b-v0.1", "a100-80gb", num_gpus=1)
    limits = SchedulerLimits(max_model_len=32768, max_num_batched_tokens=32768)
    peaks = {}
    for name in ("paged", "paged_hybrid"):
        allocator = make_allocator(name, deployment.num_kv_slots, BLOCK, 32768,
                                   hybrid_pool=hybrid_pool(deployment, BLOCK, None))  # fmt: skip
        result = simulate([REQUEST], Scheduler(limits), allocator,
                          RooflineCostModel(deployment=deployment))  # fmt: skip
        [record] = result.requests
        assert record.status == "finished"
        peaks[name] = record.peak_slots
    assert peaks == {"paged": 8112, "paged_hybrid": 4112}


# --- random operations on hybrid layouts ------------------------------------------------------

LAYOUTS = [
    kv_group_layout([3, None]),  # 1:1, tiny window
    kv_group_layout([5] * 5 + [None]),  # 5:1
    kv_group_layout([4] * 7 + [None] * 2),  # 7 sliding in 4 groups of 2: padding
    kv_group_layout([2, 6, None]),  # two windows and full attention
]

operations = st.lists(
    st.tuples(
        st.sampled_from(["admit", "append", "fork", "free"]),
        st.integers(0, 30),
        st.integers(0, 1000),
    ),
    max_size=40,
)


def _layer_slot_recount(allocator: PagedHybridAllocator, tokens: dict[int, int]) -> int:
    """Token states in layer-slots, from each sequence's tables alone: a live block of a group
    holds its filled positions in each of the group's real layers (shared blocks once)."""
    filled: dict[int, int] = {}
    for seq_id, num_tokens in tokens.items():
        for group, table in zip(allocator.layout.groups, allocator.group_tables(seq_id),
                                strict=True):  # fmt: skip
            for index, block in enumerate(table):
                if block is not None:
                    positions = min(max(num_tokens - index * allocator.block_size, 0),
                                    allocator.block_size)  # fmt: skip
                    filled[block] = max(filled.get(block, 0), positions * group.num_layers)
    return sum(filled.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), block_size=st.sampled_from([1, 2, 3]),
       num_blocks=st.integers(0, 40), ops=operations, prefix_caching=st.booleans())  # fmt: skip
def test_random_operations_keep_the_pool_consistent(
    layout: KvGroupLayout,
    block_size: int,
    num_blocks: int,
    ops: list[tuple[str, int, int]],
    prefix_caching: bool,
) -> None:
    """With prefix caching, requests share prefixes of three groups (hits, cached free blocks
    revived and evicted): the same invariants hold."""
    num_layers = layout.num_model_layers
    num_slots = -(-num_blocks * block_size * layout.group_size // num_layers)
    allocator = PagedHybridAllocator(num_slots, block_size, 64, layout=layout,
                                     num_blocks=num_blocks,
                                     enable_prefix_caching=prefix_caching)  # fmt: skip
    tokens: dict[int, int] = {}
    next_id = 0
    for op, count, pick in ops:
        live = sorted(tokens)
        if op == "admit":
            next_id += 1
            request = Request(next_id, 0.0, count, 20, prefix_group=pick % 3, prefix_tokens=count)
            if allocator.admit(next_id, request, count):
                tokens[next_id] = count
        elif live and op == "append":
            seq_id = live[pick % len(live)]
            if allocator.append(seq_id, count % 4):
                tokens[seq_id] += count % 4
                if count % 4:
                    # A sliding group holds the window's w - 1 earlier tokens and the k new ones:
                    # with n computed, blocks from (n - w + 1) // b to ceil((n + k) / b), at most
                    # ceil((w - 2 + k) / b) + 1 (the window plus one block when k = 1).
                    for group, held in zip(layout.groups, allocator.group_held_tokens(seq_id),
                                           strict=True):  # fmt: skip
                        if group.window_tokens is not None:
                            window_and_new = group.window_tokens - 2 + count % 4
                            most = -(-window_and_new // block_size) + 1
                            assert held <= most * block_size
        elif live and op == "fork":
            next_id += 1
            assert allocator.fork(live[pick % len(live)], next_id)
            tokens[next_id] = tokens[live[pick % len(live)]]
        elif live and op == "free":
            allocator.free(live[pick % len(live)])
            del tokens[live[pick % len(live)]]
        references = Counter(block for seq_id in tokens for block in allocator.block_table(seq_id))
        for block in range(num_blocks):
            assert allocator.ref_count(block) == references[block]
        for seq_id, num_tokens in tokens.items():
            assert allocator.num_tokens(seq_id) == num_tokens
            for table in allocator.group_tables(seq_id):
                assert len(table) == -(-num_tokens // block_size)
                assert num_tokens == 0 or table[-1] is not None
        usage = allocator.usage()  # MemoryUsage checks that the categories add up
        exact_layer_slots = _layer_slot_recount(allocator, tokens)
        assert abs(usage.token_states * num_layers - exact_layer_slots) < num_layers
        num_free_blocks = num_blocks - len(references)
        assert allocator.num_free_blocks() == num_free_blocks
        exact_free = num_free_blocks * block_size * layout.group_size
        assert abs(usage.free * num_layers - exact_free) < num_layers
    for seq_id in list(tokens):
        allocator.free(seq_id)
    assert allocator.num_free_blocks() == num_blocks
    usage = allocator.usage()
    assert usage.token_states == usage.reservation == usage.internal_frag == 0


def _state(allocator: PagedHybridAllocator, seq_ids: list[int]) -> tuple:
    return (allocator.usage(), allocator.free_blocks(),
            [(allocator.num_tokens(seq_id), allocator.group_tables(seq_id),
              allocator.held_slots(seq_id)) for seq_id in seq_ids])  # fmt: skip


def test_cohort_rounds_leave_the_state_of_single_appends() -> None:
    """The decode cohort (``join_cohort``, ``advance_cohort``): a round gives the state one
    ``append`` per member in join order gives (blocks, tables, usage, free queue, counts), its
    need (``cohort_next_round_blocks``) is the most those appends outrun the free blocks, and
    members leave and are freed at any point; sequences forked and grown apart share their
    leading blocks, so a round frees a shared block only at its last reference."""
    stats: Counter[str] = Counter()
    for seed in range(60):
        _compare_cohort_with_single_appends(random.Random(seed), stats)
    assert stats["rounds"] > 500 and stats["rounds needing blocks"] > 50, stats
    assert stats["rounds with forked members"] > 50, stats


def _compare_cohort_with_single_appends(rng: random.Random, stats: Counter[str]) -> None:
    layout = random_layout(rng)
    block_size = rng.choice([1, 2, 4, 16])
    num_blocks = rng.choice([60, 200, 1000])
    slot_ahead = rng.random() < 0.5
    lazy, single = (hybrid_over(num_blocks, block_size, layout, 4096,
                                generated_slot_ahead=slot_ahead) for _ in range(2))  # fmt: skip
    live: list[int] = []
    members: list[int] = []  # in join order
    final_tokens: dict[int, int] = {}
    forked: set[int] = set()  # sequences sharing blocks with a fork
    for seq_id in range(200):
        operation = rng.choice(["admit", "admit", "fork", "advance", "advance", "advance",
                                "leave", "free"])  # fmt: skip
        if operation == "admit":
            request = Request(seq_id, 0.0, rng.randint(1, 120), rng.randint(1, 200))
            if not lazy.admit(seq_id, request, request.prompt_tokens + 1):
                continue
            assert single.admit(seq_id, request, request.prompt_tokens + 1)
            live.append(seq_id)
            final_tokens[seq_id] = request.total_tokens
        elif operation == "fork" and len(live) > len(members):
            # A non-member forks, and both grow a token apart (a copy-on-write, or new blocks).
            parent = rng.choice([other for other in live if other not in members])
            if (lazy.num_tokens(parent) + 1 >= final_tokens[parent]
                    or lazy.num_free_blocks() < 2 * len(layout.groups)):  # fmt: skip
                continue
            for allocator in (lazy, single):
                assert allocator.fork(parent, seq_id)
                assert allocator.append(parent, 1) and allocator.append(seq_id, 1)
            live.append(seq_id)
            final_tokens[seq_id] = final_tokens[parent]
            forked |= {parent, seq_id}
        elif operation == "advance" and members:
            if min(final_tokens[member] - lazy.num_tokens(member) for member in members) < 1:
                continue
            need = lazy.cohort_next_round_blocks()
            if need > lazy.num_free_blocks():
                continue
            free_before = min_free = single.num_free_blocks()
            for member in members:
                assert single.append(member, 1)
                min_free = min(min_free, single.num_free_blocks())
            assert need == free_before - min_free
            lazy.advance_cohort(1)
            stats["rounds"] += 1
            stats["rounds needing blocks"] += need > 0
            stats["rounds with forked members"] += len(forked.intersection(members)) > 1
        elif operation == "leave" and members:
            lazy.leave_cohort([members.pop(rng.randrange(len(members)))])
        elif operation == "free" and live:
            freed = live.pop(rng.randrange(len(live)))
            if freed in members:
                members.remove(freed)
            lazy.free(freed)
            single.free(freed)
        joining = [other for other in live if other not in members and rng.random() < 0.5]
        if joining and lazy.join_cohort(joining):
            members += joining
        assert _state(lazy, live) == _state(single, live)
