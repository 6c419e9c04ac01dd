"""Capacity parity with vLLM v1: the pool in blocks and vLLM's two startup figures.

The first tests pin kvbench's formulas on figures worked out by hand; the ``peer`` tests compare
them, for every catalog model, with what vLLM's own ``kv_cache_utils`` computes from the same KV
memory (0 blocks apart), and check ``allocator.num_gpu_blocks`` against vLLM's null block.
"""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from referee_support import peer

from kvbench.core.catalog import get_deployment, hardware_names, model_names
from kvbench.core.kv_capacity import (
    deployment_startup_figures,
    num_gpu_blocks,
    pool_slots,
    vllm_startup_figures,
)


def test_startup_figures_follow_vllms_formula_on_hand_worked_numbers() -> None:
    # 100 blocks; a 2,048-token request takes 128 blocks of 16: 100 / 128 = 0.78125 requests.
    figures = vllm_startup_figures(num_blocks=100, block_size=16, max_model_len=2048)
    assert figures.max_concurrency == 0.78125
    assert figures.kv_cache_size_tokens == 1600
    assert figures.log_line() == (
        "GPU KV cache size: 1,600 tokens, Maximum concurrency for 2,048 tokens per request: 0.78x"
    )
    # A length that is not a whole number of blocks still takes a whole last block.
    assert vllm_startup_figures(10, 16, 33).max_concurrency == 10 / 3


def test_num_gpu_blocks_keeps_vllms_null_block_out_of_the_pool() -> None:
    deployment = get_deployment("opt-13b", "a100-40gb", kv_cache_gib=12)
    assert num_gpu_blocks(deployment, 16) == deployment.num_kv_slots // 16
    assert num_gpu_blocks(deployment, 16, override=11) == 11
    assert pool_slots(deployment, 16, None) == deployment.num_kv_slots
    assert pool_slots(deployment, 16, 11) == 10 * 16
    figures = deployment_startup_figures(deployment, 16, override=11)
    assert figures.max_concurrency == 11 / 128


SMALL_RUN = [
    "workload=fixed",
    "workload.num_requests=6",
    "workload.prompt_tokens=100",
    "workload.output_tokens=47",
    "model=opt-13b",
    "hardware=a100-40gb",
    "allocators=[paged]",
    "progress=false",
    "plots=false",
]


def test_allocator_num_gpu_blocks_sizes_the_run_and_prints_vllms_figures(tmp_path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", *SMALL_RUN, "allocator.num_gpu_blocks=11",
         f"hydra.run.dir={out}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = pd.read_parquet(out / "summary.parquet")
    assert summary["num_kv_slots"].tolist() == [10 * 16]  # 11 blocks, one of them null
    requests = pd.read_parquet(out / "requests.parquet")
    assert (requests["status"] == "finished").all()
    # 147 tokens take all 10 usable blocks: one request at a time.
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps["batch_size"].max() == 1
    assert "GPU KV cache size: 176 tokens" in done.stdout  # 11 / 128 x 2,048


def test_a_pool_without_a_usable_block_is_a_config_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvbench", *SMALL_RUN, "allocator.num_gpu_blocks=1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert "allocator.num_gpu_blocks=1: must be >= 2" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _deployments(model: str):
    """Every (deployment, block size) of ``model`` vLLM would serve: the catalog's GPUs, 1 to 8
    of them where the query heads split evenly, plus a fixed KV size in fractional GiB."""
    from kvbench.core.catalog import get_model

    heads = get_model(model).num_attention_heads
    for hardware in hardware_names():
        for num_gpus in (1, 2, 4, 8):
            deployment = get_deployment(model, hardware, num_gpus=num_gpus)
            if heads % num_gpus or deployment.kv_cache_bytes <= 0:
                continue
            for block_size in (16, 32):
                yield deployment, block_size
    yield get_deployment(model, "h100-80gb", num_gpus=8, kv_cache_gib=12.3), 16


@pytest.mark.parametrize("model", model_names())
@peer
def test_kvbench_and_vllm_size_the_same_pool_for_every_catalog_model(model: str) -> None:
    from kvbench.referee.vllm_capacity import vllm_num_gpu_blocks, vllm_startup_figures_of

    compared = 0
    for deployment, block_size in _deployments(model):
        where = f"{deployment.num_gpus}x {deployment.hardware.name}, block {block_size}"
        assert num_gpu_blocks(deployment, block_size) == vllm_num_gpu_blocks(
            deployment, block_size
        ), where
        assert deployment_startup_figures(deployment, block_size) == vllm_startup_figures_of(
            deployment, block_size
        ), where
        compared += 1
    assert compared >= 2


@peer
def test_num_gpu_blocks_has_the_meaning_of_vllms_override() -> None:
    from vllm.v1.core.block_pool import BlockPool

    from kvbench.referee.vllm_capacity import vllm_num_gpu_blocks, vllm_startup_figures_of

    deployment = get_deployment("llama-2-70b", "a100-80gb", num_gpus=4)
    for override in (2, 11, 1000):
        assert vllm_num_gpu_blocks(deployment, 16, override) == override
        assert deployment_startup_figures(deployment, 16, override) == vllm_startup_figures_of(
            deployment, 16, override
        )
        pool = BlockPool(num_gpu_blocks=override, enable_caching=True, hash_block_size=16)
        # vLLM hands out all but its null block: kvbench's pool holds exactly those.
        assert pool.get_num_free_blocks() * 16 == pool_slots(deployment, 16, override)


# --- hybrid models: vLLM's hybrid KV-cache manager (paged_hybrid's pool) ---------------------


def _hybrid_model_names() -> list[str]:
    from kvbench.core.catalog import get_model

    return [name for name in model_names() if get_model(name).is_hybrid]


def test_the_catalog_has_the_issues_hybrid_models() -> None:
    assert set(_hybrid_model_names()) >= {
        "mistral-7b-v0.1", "gemma-2-9b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b",
    }  # fmt: skip


def test_hybrid_pool_blocks_on_hand_worked_numbers() -> None:
    from kvbench.core.kv_capacity import hybrid_num_gpu_blocks, hybrid_pool

    # Gemma-3-27B on 2 GPUs with 10 GiB of KV: 16 KV heads x 128 dims x 2 (K, V) x 2 bytes =
    # 8,192 B per layer and token, 4,096 B on each GPU; a block is 16 tokens of a group of 10
    # layers (the 10 full layers set the group size): 655,360 B per GPU. 5 GiB per GPU / that =
    # 8,192 blocks, where 62 layers of full attention get 5 GiB / (62 x 16 x 4,096) = 1,321.
    deployment = get_deployment("gemma-3-27b", "h100-80gb", num_gpus=2, kv_cache_gib=10)
    assert hybrid_num_gpu_blocks(deployment, 16) == 8192
    assert num_gpu_blocks(deployment, 16) == 1321
    pool = hybrid_pool(deployment, 16, None)
    assert pool.num_blocks == 8192
    # Those blocks hold 8,192 x 16 x 10 layer-tokens = 21,140.6 whole-model tokens.
    assert pool.num_slots == max(deployment.num_kv_slots, 21141)
    # With vLLM's num_gpu_blocks_override=N, N - 1 blocks (its null block), in slots rounded up.
    overridden = hybrid_pool(deployment, 16, 101)
    assert (overridden.num_blocks, overridden.num_slots) == (100, -(-100 * 16 * 10 // 62))


def test_hybrid_startup_figures_count_a_windows_blocks_per_sliding_group() -> None:
    from kvbench.core.kv_capacity import hybrid_startup_figures

    # gpt-oss-20b, 1,000 blocks of 16: a 131,072-token request takes 8,192 blocks in the full
    # group and ceil((128 - 1 + 8,192) / 16) + 1 = 521 in the sliding one (8,192 tokens in
    # flight): 1,000 / 8,713 requests.
    deployment = get_deployment("gpt-oss-20b", "h100-80gb", num_gpus=1)
    figures = hybrid_startup_figures(deployment, 16, 8192, override=1000)
    assert figures.max_concurrency == 1000 / 8713
    assert figures.kv_cache_size_tokens == int(1000 / 8713 * 131072)


@pytest.mark.parametrize("model", _hybrid_model_names())
@peer
def test_kvbench_and_vllm_build_the_same_groups_and_hybrid_pool(model: str) -> None:
    from kvbench.core.kv_capacity import hybrid_num_gpu_blocks, hybrid_startup_figures
    from kvbench.core.kv_groups import kv_group_layout
    from kvbench.referee.vllm_capacity import (
        vllm_group_layer_counts,
        vllm_num_gpu_blocks,
        vllm_startup_figures_of,
    )

    compared = 0
    for deployment, block_size in _deployments(model):
        where = f"{deployment.num_gpus}x {deployment.hardware.name}, block {block_size}"
        assert hybrid_num_gpu_blocks(deployment, block_size) == vllm_num_gpu_blocks(
            deployment, block_size, hybrid=True
        ), where
        # The referee's scheduler budget: max(max_model_len, 2048) tokens in flight.
        in_flight = max(deployment.model.max_model_len, 2048)
        assert hybrid_startup_figures(
            deployment, block_size, in_flight
        ) == vllm_startup_figures_of(deployment, block_size, hybrid=True), where
        compared += 1
    assert compared >= 2
    layout = kv_group_layout(deployment.model.layer_windows)
    assert [(g.window_tokens, g.num_layers) for g in layout.groups] == vllm_group_layer_counts(
        deployment, 16
    )


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-2-70b", "opt-13b"])
@peer
def test_kvbench_and_vllm_size_the_same_fp8_pool(model: str) -> None:
    # vLLM's cache_dtype=fp8 stores one byte per K/V element: its blocks are half the bytes, and
    # kvbench's model.kv_dtype=fp8 must count the same pool.
    from dataclasses import replace

    from kvbench.referee.vllm_capacity import vllm_num_gpu_blocks, vllm_startup_figures_of

    compared = 0
    for deployment, block_size in _deployments(model):
        fp8 = replace(deployment, model=replace(deployment.model, kv_dtype="fp8"))
        where = f"fp8, {fp8.num_gpus}x {fp8.hardware.name}, block {block_size}"
        assert num_gpu_blocks(fp8, block_size) == vllm_num_gpu_blocks(fp8, block_size), where
        assert deployment_startup_figures(fp8, block_size) == vllm_startup_figures_of(
            fp8, block_size
        ), where
        compared += 1
    assert compared >= 2
