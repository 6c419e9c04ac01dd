"""The CPU tier of the prefix-caching allocators (allocator.cpu_cache_gib): evicted blocks move
to an LRU set in CPU memory, a later hit loads them back over PCIe."""

from __future__ import annotations

import pytest
from conftest import compose_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.allocators import PagedAllocator, RadixAllocator, make_allocator
from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.core.specs import GIB
from kvbench.engine import RooflineCostModel, Scheduler, SchedulerLimits, simulate
from kvbench.engine.cost_model import IterationShape

DEPLOYMENT = get_deployment("llama-3-8b", "a100-80gb")


def _group(request_id: int, group: int, prompt: int = 16) -> Request:
    return Request(request_id, 0.0, prompt, 4, prefix_group=group, prefix_tokens=prompt)


def _paged(num_blocks: int, cpu_blocks: int) -> PagedAllocator:
    return PagedAllocator(num_blocks * 4, 4, 1000, enable_prefix_caching=True,
                          cpu_cache_blocks=cpu_blocks)  # fmt: skip


def _radix(num_pages: int, cpu_pages: int) -> RadixAllocator:
    return RadixAllocator(num_pages * 4, 1000, page_tokens=4, cpu_cache_pages=cpu_pages)


def test_radix_counts_the_pages_it_loads_out_of_the_tier_before_it_evicts_into_it() -> None:
    # A's 2 pages go to the CPU tier (3 pages) when B needs the pool; C loads A's first page
    # back, and its allocation evicts B's 3 pages into the tier. Counted without the page C
    # loads, the tier holds 1 + 3 = 4 > 3 and drops A's other page only: B stays cached.
    radix = RadixAllocator(3, 64, page_tokens=1, cpu_cache_pages=3)
    assert radix.admit(0, Request(0, 0.0, 2, 4, prefix_group=1, prefix_tokens=2), 2)
    radix.free(0)
    b = Request(1, 0.0, 3, 4, prefix_group=2, prefix_tokens=3)
    assert radix.admit(1, b, 3)
    radix.free(1)
    assert radix.admit(2, Request(2, 0.0, 1, 4, prefix_group=1, prefix_tokens=1), 1)
    assert radix.match_tokens(b, 3) == 3
    assert radix.cpu_cached_tokens() == 3  # B's 3 pages; A's lower page dropped


@pytest.mark.parametrize("make", [_paged, _radix])
def test_an_evicted_prefix_comes_back_from_the_cpu_tier(make) -> None:
    allocator = make(4, 8)  # 4 GPU blocks of 4 tokens, 8 in the CPU tier
    assert allocator.admit(0, _group(0, 1), 16)  # group 1 fills the GPU
    allocator.free(0)
    assert allocator.admit(1, _group(1, 2), 16)  # group 2 evicts it to the CPU
    cache = allocator.prefix_cache
    assert (cache.cached_prefix_tokens(1), cache.loaded_prefix_tokens(1)) == (0, 0)
    allocator.free(1)
    assert cache.match_tokens(_group(9, 1), 16) == 16  # found, in the CPU tier
    assert allocator.admit(2, _group(2, 1), 16)  # loads group 1 back, evicting group 2
    assert (cache.cached_prefix_tokens(2), cache.loaded_prefix_tokens(2)) == (16, 16)
    allocator.free(2)
    assert allocator.admit(3, _group(3, 1), 16)  # now a GPU hit
    assert (cache.cached_prefix_tokens(3), cache.loaded_prefix_tokens(3)) == (16, 0)
    assert cache.match_tokens(_group(9, 2), 16) == 16  # group 2 went to the CPU in turn


@pytest.mark.parametrize("make", [_paged, _radix])
def test_without_a_tier_an_evicted_prefix_is_gone(make) -> None:
    allocator = make(4, 0)
    assert allocator.admit(0, _group(0, 1), 16)
    allocator.free(0)
    assert allocator.admit(1, _group(1, 2), 16)
    allocator.free(1)
    assert allocator.prefix_cache.match_tokens(_group(9, 1), 16) == 0


@pytest.mark.parametrize("make", [_paged, _radix])
def test_the_cpu_tier_keeps_its_most_recently_evicted_blocks(make) -> None:
    allocator = make(4, 6)  # a CPU tier of 6 blocks: a group and a half
    for request_id, group in enumerate((1, 2, 3)):
        assert allocator.admit(request_id, _group(request_id, group), 16)
        allocator.free(request_id)
    # Groups 1 and 2 were evicted, in that order; the tier dropped group 1's least recent blocks.
    cache = allocator.prefix_cache
    assert cache.match_tokens(_group(9, 3), 16) == 16  # on the GPU
    assert cache.match_tokens(_group(9, 2), 16) == 16  # on the CPU
    assert cache.match_tokens(_group(9, 1), 16) < 16


def test_radix_cpu_tier_holds_at_most_its_pages_and_the_leaf_goes_first() -> None:
    radix = _radix(4, 3)
    assert radix.admit(0, _group(0, 1), 16)
    radix.free(0)
    assert radix.admit(1, _group(1, 2, prompt=8), 8)  # evicts group 1 (4 pages) to a 3-page tier
    assert radix.cpu_cached_tokens() == 0  # the tier drops the whole leaf: a node is one unit
    radix.free(1)
    assert radix.admit(2, _group(2, 1, prompt=8), 8)  # group 1's first 8 tokens, again
    radix.free(2)
    assert radix.admit(3, _group(3, 3), 16)  # evicts groups 1 and 2 (2 pages each) into 3 pages
    assert radix.cpu_cached_tokens() <= 3 * 4


def test_a_cpu_hit_delays_its_prefill_by_the_pcie_copy() -> None:
    """A pool of 275 blocks of 16; requests of 2,101 tokens (132 blocks, the first 128 hashed)
    of groups 0, 1, 2, 0 one after another. Group 2 takes the 11 never-used blocks and 121 of
    group 0's, tail first (4 unhashed, then 117 hashed): the last request finds 11 blocks on the
    GPU and 117 in the CPU tier, and its iteration costs its compute (the 2,048 cached tokens
    skipped) plus swap_time_s of the 1,872 loaded tokens."""
    costs = RooflineCostModel(DEPLOYMENT)
    requests = [Request(i, float(i), 2_100, 1, prefix_group=group, prefix_tokens=2_048)
                for i, group in enumerate((0, 1, 2, 0))]  # fmt: skip
    limits = SchedulerLimits(max_model_len=8192, max_num_batched_tokens=8192)
    tiered = PagedAllocator(4_400, 16, 8192, enable_prefix_caching=True, cpu_cache_blocks=1_000)
    result = simulate(requests, Scheduler(limits), tiered, costs)
    last = result.requests[3]
    assert (last.cached_prompt_tokens, last.cpu_cached_prompt_tokens) == (2_048, 117 * 16)
    step = result.steps.columns["time_s"].index(last.admit_s)
    length, cached = 2_100, 2_048
    shape = IterationShape(length - cached, length * (length + 1) // 2
                           - cached * (cached + 1) // 2, 0, 0)  # fmt: skip
    expected_s = costs.iteration_time_s(shape) + costs.swap_time_s(117 * 16)
    assert result.steps.columns["duration_s"][step] == pytest.approx(expected_s, rel=1e-12)
    untiered = PagedAllocator(4_400, 16, 8192, enable_prefix_caching=True)
    untiered_last = simulate(requests, Scheduler(limits), untiered, costs).requests[3]
    assert untiered_last.cached_prompt_tokens == 11 * 16


@pytest.mark.parametrize("name", ["paged_prefix", "radix"])
def test_fast_and_step_by_step_runs_agree_with_a_tier(name) -> None:
    requests = [Request(i, 0.02 * i, 200 + 13 * (i % 7), 20 + i % 11, prefix_group=i % 9,
                        prefix_tokens=192) for i in range(120)]  # fmt: skip
    limits = SchedulerLimits(max_model_len=4096)
    results = []
    for fast in (True, False):
        allocator = make_allocator(name, 2_000, 16, 4096, cpu_cache_slots=800)
        results.append(simulate(requests, Scheduler(limits), allocator,
                                RooflineCostModel(DEPLOYMENT), fast=fast))  # fmt: skip
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests
    assert sum(record.cpu_cached_prompt_tokens for record in results[0].requests) > 0


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cpu_pages=st.integers(0, 12),
    operations=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 30), st.booleans()),
                        max_size=30),
)
def test_radix_tier_stays_within_its_size_and_hits_stay_true(cpu_pages, operations) -> None:
    radix = RadixAllocator(40, 64, page_tokens=2, cpu_cache_pages=cpu_pages)
    running: list[int] = []
    for request_id, (group, prompt, free_first) in enumerate(operations):
        if free_first and running:
            radix.free(running.pop(0))
        request = Request(request_id, 0.0, prompt, 4, prefix_group=group, prefix_tokens=prompt)
        if radix.admit(request_id, request, prompt):
            running.append(request_id)
            hit = radix.cached_prefix_tokens(request_id)
            assert radix.loaded_prefix_tokens(request_id) <= hit <= prompt // 2 * 2
        assert radix.cpu_cached_tokens() <= cpu_pages * 2
        assert radix.usage().num_slots == 40


def test_summary_splits_the_hit_rate_by_tier(tmp_path) -> None:
    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(
        "workload=system_prompt", "workload.num_users=20", "allocators=[paged_prefix,radix]",
        "allocator.num_gpu_blocks=120", "allocator.cpu_cache_gib=1", "progress=false",
        "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path)
    total = summary["prefix_gpu_hit_rate"] + summary["prefix_cpu_hit_rate"]
    assert total.to_list() == pytest.approx(summary["prefix_hit_rate"].to_list())
    assert (summary["cpu_cache_gib"] == 1).all()


def test_cpu_cache_config_errors_are_one_line() -> None:
    with pytest.raises(ConfigError, match=r"allocator.cpu_cache_gib=-1.0: must be >= 0"):
        compose_config("allocator.cpu_cache_gib=-1")
    with pytest.raises(ConfigError, match=r"none of allocators=\['paged'\].*add paged_prefix"):
        compose_config("allocator.cpu_cache_gib=4", "allocators=[paged]")
    # Llama-3-8B: 128 KiB of K/V a token, so 0.001 GiB holds 8 tokens, less than a block of 16
    # (it would silently be no tier); a radix page of 1 token fits.
    with pytest.raises(ConfigError, match=r"cpu_cache_gib=0.001: holds 8 tokens of "
                                          r"model=llama-3-8b, less than one block of 16 for "
                                          r"paged_prefix; set it to >= 0.001953 GiB"):  # fmt: skip
        compose_config("model=llama-3-8b", "allocator.cpu_cache_gib=0.001",
                       "allocators=[paged_prefix]")  # fmt: skip
    compose_config("model=llama-3-8b", "allocator.cpu_cache_gib=0.001", "allocators=[radix]")
    # vllm_v1's tier of chunks of 4 blocks: 40 tokens hold no chunk of 64.
    with pytest.raises(ConfigError, match=r"holds 40 tokens of model=llama-3-8b, less than one "
                                          r"chunk of 64 for paged_prefix"):  # fmt: skip
        compose_config("scheduler=vllm_v1", "model=llama-3-8b", "allocator.cpu_cache_gib=0.005",
                       "allocators=[paged_prefix]", "allocator.cpu_blocks_per_chunk=4")  # fmt: skip


def test_the_v1_tier_options_are_refused_where_no_engine_runs_them() -> None:
    with pytest.raises(ConfigError, match=r"cpu_eviction_policy='fifo': vLLM's CPU tier evicts "
                                          r"by lru or arc"):  # fmt: skip
        compose_config("scheduler=vllm_v1", "allocator.cpu_eviction_policy=fifo")
    with pytest.raises(ConfigError, match=r"cpu_store_threshold=-2: must be >= 0"):
        compose_config("scheduler=vllm_v1", "allocator.cpu_store_threshold=-2")
    # vllm_v0's tier keeps what the GPU evicts, by LRU: it has no ARC and no reuse filter.
    with pytest.raises(ConfigError, match=r"options of vLLM v1's CPU offloading; "
                                          r"scheduler=vllm_v0's tier is LRU"):  # fmt: skip
        compose_config("allocator.cpu_eviction_policy=arc")
    with pytest.raises(ConfigError, match=r"cpu_offload_prompt_only=False, "):
        compose_config("allocator.cpu_offload_prompt_only=false")
    with pytest.raises(ConfigError, match=r"cpu_blocks_per_chunk=4: options of vLLM v1"):
        compose_config("allocator.cpu_blocks_per_chunk=4")
    with pytest.raises(ConfigError, match=r"cpu_blocks_per_chunk=0: must be >= 1"):
        compose_config("scheduler=vllm_v1", "allocator.cpu_blocks_per_chunk=0")
    compose_config("scheduler=vllm_v1", "allocator.cpu_eviction_policy=arc",
                   "allocator.cpu_store_threshold=2", "allocator.cpu_offload_prompt_only=false")


def test_a_v1_run_reports_what_it_stored_and_a_store_threshold_stores_less(tmp_path) -> None:
    from kvbench.tasks.simulate.experiment import run_experiment

    stored_gib = {}
    for threshold in (0, 2):
        cfg, deployment, raw = compose_config(
            "scheduler=vllm_v1", "workload=system_prompt", "workload.num_users=20",
            "allocators=[paged_prefix]", "allocator.num_gpu_blocks=120",
            "allocator.cpu_cache_gib=1", f"allocator.cpu_store_threshold={threshold}",
            "progress=false", "plots=false", "summary_table=false",
        )  # fmt: skip
        summary = run_experiment(cfg, deployment, raw, tmp_path / str(threshold))
        assert summary["cpu_store_threshold"].to_list() == [threshold]
        stored_gib[threshold] = summary["cpu_stored_gib"].item()
        block_gib = cfg.allocator.block_size * deployment.kv_bytes_per_token / GIB
    # A 1,024-token system prompt (64 blocks of 16) and 20 users' own 64 tokens (4 blocks each),
    # all prompt blocks, all fitting in the tier's 512 blocks. Each user's own blocks are
    # offered once: with the filter, only the shared prompt is stored.
    assert stored_gib[0] == pytest.approx((64 + 20 * 4) * block_gib)
    assert stored_gib[2] == pytest.approx(64 * block_gib)


def test_a_v1_tier_storing_generated_tokens_stores_their_full_blocks_too(tmp_path) -> None:
    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(
        "scheduler=vllm_v1", "workload=system_prompt", "workload.num_users=20",
        "allocators=[paged_prefix]", "allocator.num_gpu_blocks=120", "allocator.cpu_cache_gib=1",
        "allocator.cpu_offload_prompt_only=false",
        "progress=false", "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path)
    assert summary["cpu_offload_prompt_only"].to_list() == [False]
    block_gib = cfg.allocator.block_size * deployment.kv_bytes_per_token / GIB
    # Each user's 1,088 prompt tokens and 128 generated ones: K/V computed for 1,215 of them, 75
    # full blocks of 16, 7 past its prompt's 68. Prompt blocks as above (64 shared, 4 own).
    assert summary["cpu_stored_gib"].item() == pytest.approx((64 + 20 * 4 + 20 * 7) * block_gib)


def test_a_v1_tier_of_chunks_stores_whole_chunks_only(tmp_path) -> None:
    from kvbench.tasks.simulate.experiment import run_experiment

    cfg, deployment, raw = compose_config(
        "scheduler=vllm_v1", "workload=system_prompt", "workload.num_users=20",
        "allocators=[paged_prefix]", "allocator.num_gpu_blocks=120", "allocator.cpu_cache_gib=1",
        "allocator.cpu_blocks_per_chunk=3", "progress=false", "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path)
    assert summary["cpu_blocks_per_chunk"].to_list() == [3]
    block_gib = cfg.allocator.block_size * deployment.kv_bytes_per_token / GIB
    # Each user's 68 prompt blocks make 22 chunks of 3 (the last 2 blocks make none). The first
    # 21 chunks hold the shared prompt's first 63 blocks, stored once; chunk 21 (blocks 63-65)
    # holds the prompt's last block and 2 of the user's own: each user stores it.
    assert summary["cpu_stored_gib"].item() == pytest.approx((63 + 20 * 3) * block_gib)
