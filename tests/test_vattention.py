"""The ``vattention`` allocator: virtual spans over page groups mapped on demand, hand-checked on
the issue's example, its span limit, deferred reclamation, its page-mapping cost, and its config."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from conftest import compose_config

from kvbench.allocators import VAttentionAllocator, VAttentionSettings, make_allocator
from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.core.request import Request
from kvbench.engine import (
    IterationShape,
    PageMapping,
    RooflineCostModel,
    Scheduler,
    SchedulerLimits,
    simulate,
)
from kvbench.tasks.simulate.experiment import run_experiment

KIB = 1024
LLAMA3_8B = get_deployment("llama-3-8b", "h100-80gb")
LLAMA3_8B_FP8 = replace(LLAMA3_8B, model=replace(LLAMA3_8B.model, kv_dtype="fp8"))


def _held_after_one_request(allocator) -> tuple[int, object]:
    """Slots the issue's request (100 prompt + 47 output tokens) holds at its end, and usage."""
    request = Request(0, 0.0, 100, 47)
    assert allocator.admit(0, request, 100)
    for _ in range(47):
        assert allocator.append(0, 1)
    return allocator.held_slots(0), allocator.usage()


def _vattention(deployment, page_bytes: int, **settings) -> VAttentionAllocator:
    vattention = VAttentionSettings(deployment.tokens_per_page(page_bytes), **settings)
    allocator = make_allocator("vattention", deployment.num_kv_slots, 16,
                               deployment.model.max_model_len, vattention=vattention)  # fmt: skip
    assert isinstance(allocator, VAttentionAllocator)
    return allocator


def test_the_issues_hand_checked_request_on_llama_3_8b() -> None:
    # 8 KV heads x 128 x 2 bytes = 2,048 B per token per layer tensor: 1,024 tokens in 2 MiB.
    assert LLAMA3_8B.tokens_per_page(2048 * KIB) == 1024
    assert LLAMA3_8B.tokens_per_page(64 * KIB) == 32
    held, usage = _held_after_one_request(_vattention(LLAMA3_8B, 2048 * KIB))
    assert held == 1024  # one page per tensor
    assert (usage.token_states, usage.reservation, usage.internal_frag) == (147, 0, 1024 - 147)
    held, usage = _held_after_one_request(_vattention(LLAMA3_8B, 64 * KIB))
    assert held == 160  # five pages of 32
    assert (usage.token_states, usage.internal_frag) == (147, 13)
    paged = make_allocator("paged", LLAMA3_8B.num_kv_slots, 16, 8192)
    assert _held_after_one_request(paged)[0] == 160


def test_fp8_doubles_the_tokens_of_a_page_and_the_pool() -> None:
    assert LLAMA3_8B_FP8.tokens_per_page(2048 * KIB) == 2048
    assert LLAMA3_8B_FP8.tokens_per_page(64 * KIB) == 64
    held, _ = _held_after_one_request(_vattention(LLAMA3_8B_FP8, 64 * KIB))
    assert held == 192  # three pages of 64
    for page_bytes in (64 * KIB, 2048 * KIB):
        fp16_pages = _vattention(LLAMA3_8B, page_bytes).num_free_blocks()
        fp8 = _vattention(LLAMA3_8B_FP8, page_bytes)
        # Twice the slots in pages of twice the tokens: the same page groups, within one.
        assert abs(fp8.num_free_blocks() - fp16_pages) <= 1
        assert abs(fp8.num_free_blocks() * fp8.block_size - 2 * fp16_pages * 1024 * page_bytes
                   // (2048 * KIB)) <= fp8.block_size  # fmt: skip


def test_tensor_parallelism_splits_the_heads_a_page_holds() -> None:
    # Llama-3-70B on 4 GPUs: 2 KV heads per GPU x 128 x 2 B = 512 B per token: 128 tokens in 64 KiB.
    deployment = get_deployment("llama-3-70b", "h100-80gb", num_gpus=4)
    assert deployment.kv_heads_per_gpu == 2
    assert deployment.tokens_per_page(64 * KIB) == 128
    assert deployment.tokens_per_page(2048 * KIB) == 4096


def test_a_request_waits_when_every_span_is_taken() -> None:
    allocator = _vattention(LLAMA3_8B, 64 * KIB, max_batch_size=2)
    requests = [Request(i, 0.0, 10, 5) for i in range(3)]
    assert allocator.admit(0, requests[0], 10)
    assert allocator.admit(1, requests[1], 10)
    assert allocator.usage().free > 0  # memory is there ...
    assert not allocator.can_admit(requests[2], 10)  # ... but no span
    assert not allocator.admit(2, requests[2], 10)
    assert not allocator.fork(0, 7)
    allocator.free(0)
    assert allocator.admit(2, requests[2], 10)


def test_deferred_reclamation_keeps_pages_mapped_as_reservation_until_needed() -> None:
    allocator = VAttentionAllocator(10 * 4, 64, VAttentionSettings(4, retain_pages=2))
    assert allocator.admit(0, Request(0, 0.0, 12, 0), 12)  # 3 page groups of 4 tokens
    assert allocator.num_pages_mapped == 3
    allocator.free(0)
    usage = allocator.usage()
    # Two page groups stay mapped in the idle span: held as reservation, not free.
    assert (usage.reservation, usage.free, usage.token_states) == (8, 32, 0)
    assert allocator.num_free_blocks() == 8  # unmapped free page groups
    # The span's next request takes them over: only its third page is mapped anew.
    assert allocator.admit(1, Request(1, 0.0, 9, 0), 9)
    assert allocator.num_pages_mapped == 4
    assert allocator.usage().reservation == 0
    allocator.free(1)
    # An allocation the unmapped pages cannot serve reclaims the idle pages: nothing is refused.
    assert allocator.can_admit(Request(2, 0.0, 40, 0), 40)
    assert allocator.admit(2, Request(2, 0.0, 40, 0), 40)
    usage = allocator.usage()
    assert (usage.token_states, usage.reservation, usage.free) == (40, 0, 0)
    assert not allocator.try_append_round([2])  # a full pool refuses the round, no change
    assert allocator.usage() == usage


def test_forks_copy_into_a_span_of_their_own() -> None:
    allocator = VAttentionAllocator(100, 64, VAttentionSettings(4))
    assert allocator.admit(0, Request(0, 0.0, 10, 4), 10)
    assert allocator.fork(0, 1)
    assert not set(allocator.block_table(0)) & set(allocator.block_table(1))
    assert allocator.take_copy_on_writes() == list(
        zip(allocator.block_table(0), allocator.block_table(1), strict=True)
    )
    assert allocator.usage().shared_slots == 0


@pytest.mark.parametrize("retain_pages", [None, 1])
def test_the_fast_path_gives_the_step_by_step_records_with_spans_and_idle_pages(retain_pages):
    rng = random.Random(3)
    requests = [Request(i, i * 0.005, rng.randint(1, 300), rng.randint(1, 200)) for i in range(200)]
    limits = SchedulerLimits(max_model_len=1024, max_num_batched_tokens=2048)
    deployment = get_deployment("llama-3-8b", "h100-80gb")
    settings = VAttentionSettings(32, max_batch_size=24, retain_pages=retain_pages)
    results = []
    for fast in (True, False):
        allocator = VAttentionAllocator(8_000, 1024, settings)
        result = simulate(requests, Scheduler(limits), allocator, RooflineCostModel(deployment),
                          fast=fast)  # fmt: skip
        results.append(result)
    assert results[0].steps.columns == results[1].steps.columns
    assert results[0].requests == results[1].requests
    assert max(results[0].steps.columns["batch_size"]) == 24  # the spans bind


def test_page_mapping_is_priced_synchronously_or_hidden_behind_the_iteration() -> None:
    base = RooflineCostModel(LLAMA3_8B)
    # 2 MiB pages: 1,024 tokens; 64 pages (K and V of 32 layers) of 20 us per page group.
    mapping = PageMapping(tokens_per_page=1024, pages_per_group=64, latency_s_per_page=20e-6,
                          overlapped=False)  # fmt: skip
    decode = IterationShape(0, 0, 64, 64 * 1000)
    body_s = base.iteration_time_s(decode)
    decode_map_s = 64 / 1024 * 64 * 20e-6  # 80 us
    sync = RooflineCostModel(LLAMA3_8B, page_mapping=mapping)
    assert sync.iteration_time_s(decode) == pytest.approx(body_s + decode_map_s)
    overlapped = RooflineCostModel(LLAMA3_8B, page_mapping=replace(mapping, overlapped=True))
    assert body_s > decode_map_s
    assert overlapped.iteration_time_s(decode) == body_s  # hidden behind the iteration
    # A 1,024-token prefill maps 64 pages (1.28 ms): added when synchronous, hidden when not.
    prefill = IterationShape(1024, 1024 * 1025 // 2, 0, 0)
    prefill_s = base.iteration_time_s(prefill)
    assert sync.iteration_time_s(prefill) == pytest.approx(prefill_s + 64 * 20e-6)
    assert overlapped.iteration_time_s(prefill) == prefill_s
    # Mapping that outlasts the iteration shows through: 64 KiB pages at 1 ms a page.
    slow = RooflineCostModel(LLAMA3_8B, page_mapping=PageMapping(32, 64, 1e-3, overlapped=True))
    assert slow.iteration_time_s(decode) == pytest.approx(64 / 32 * 64 * 1e-3)
    # The fast path's function gives the same floats.
    for model in (sync, overlapped, slow):
        assert model.decode_time_fn(64)(64 * 1000) == model.iteration_time_s(decode)


def test_a_page_size_vattention_lacks_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"allocator.page_bytes=1000: vAttention's pages are "):
        compose_config("allocator.page_bytes=1000")
    with pytest.raises(ConfigError, match=r"allocator.max_batch_size=0: must be >= 1"):
        compose_config("allocator.max_batch_size=0")
    with pytest.raises(ConfigError, match=r"allocators contains 'vattention_1m'"):
        compose_config("allocators=[vattention_1m]")


def test_a_run_reports_pages_spans_and_virtual_memory(tmp_path) -> None:
    cfg, deployment, raw = compose_config(
        "workload=fixed", "workload.num_requests=4", "workload.prompt_tokens=100",
        "workload.output_tokens=47", "model=llama-3-8b", "hardware=h100-80gb",
        "allocators=[paged,vattention_64k,vattention_2m]", "allocator.max_batch_size=8",
        "progress=false", "plots=false", "summary_table=false",
    )  # fmt: skip
    summary = run_experiment(cfg, deployment, raw, tmp_path / "run").set_index("allocator")
    assert summary.loc["vattention_64k", "tokens_per_page"] == 32
    assert summary.loc["vattention_2m", "tokens_per_page"] == 1024
    # Four requests of five (64 KiB) or one (2 MiB) page groups, none reused: nothing overlaps.
    assert summary.loc["vattention_2m", "num_page_groups_mapped"] >= 1
    # 8 spans of 8,192 tokens at 131,072 B: 8.6 GB of address space, not of memory.
    assert summary.loc["vattention_2m", "virtual_reserved_gb"] == pytest.approx(
        8 * 8192 * 131_072 / 1e9
    )
    assert summary.loc["paged", "virtual_reserved_gb"] == pytest.approx(
        deployment.num_kv_slots * 131_072 / 1e9
    )
    assert (summary["kv_dtype"] == "bf16").all()
