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
