"""``model.kv_dtype=fp8``: one byte per K/V element, so every token costs half the bytes and every
allocator's pool holds twice the token slots; the roofline reads the halved bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import compose_config

from kvbench.allocators import ALLOCATOR_NAMES, make_allocator
from kvbench.config import ConfigError
from kvbench.core.catalog import get_deployment
from kvbench.core.kv_capacity import pool_slots
from kvbench.core.specs import Deployment
from kvbench.engine import RooflineCostModel
from kvbench.engine.cost_model import IterationShape


def _fp8(deployment: Deployment) -> Deployment:
    return replace(deployment, model=replace(deployment.model, kv_dtype="fp8"))


def test_fp8_halves_the_bytes_of_a_token_by_hand() -> None:
    deployment = get_deployment("llama-3-8b", "h100-80gb")
    # 2 (K and V) x 32 layers x 8 KV heads x 128 x 2 bytes (bf16), then 1 byte (fp8).
    assert deployment.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    fp8 = _fp8(deployment)
    assert fp8.kv_bytes_per_token == 65_536
    # The weights stay in the model's dtype: the same KV memory, twice the slots.
    assert fp8.kv_cache_bytes == deployment.kv_cache_bytes
    assert fp8.num_kv_slots == int(deployment.kv_cache_bytes // 65_536)
    assert abs(fp8.num_kv_slots - 2 * deployment.num_kv_slots) <= 1


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_fp8_doubles_every_allocators_usable_slots_within_one_unit(name: str) -> None:
    deployment = get_deployment("llama-3-8b", "h100-80gb")
    block_size, max_model_len = 16, deployment.model.max_model_len
    usable = {}
    for label, served in (("fp16", deployment), ("fp8", _fp8(deployment))):
        allocator = make_allocator(name, pool_slots(served, block_size, None), block_size,
                                   max_model_len)  # fmt: skip
        usage = allocator.usage()
        usable[label] = usage.num_slots - usage.external_frag
    # The unit an allocator hands out: a block, or for Orca (Max) a whole max-length extent.
    unit = max_model_len if name == "naive_max" else block_size
    assert abs(usable["fp8"] - 2 * usable["fp16"]) <= unit, usable
    assert usable["fp8"] > 1.9 * usable["fp16"]


def test_the_roofline_reads_the_kv_cache_in_its_own_dtype() -> None:
    deployment = get_deployment("llama-3-8b", "h100-80gb")
    fp16_terms = RooflineCostModel(deployment).terms
    fp8_terms = RooflineCostModel(_fp8(deployment)).terms
    assert fp8_terms.kv_bytes_per_token * 2 == fp16_terms.kv_bytes_per_token
    assert fp8_terms.weight_bytes == fp16_terms.weight_bytes  # weights keep the model's dtype
    # A decode iteration over a long context is bandwidth-bound: fp8 moves half the KV bytes.
    shape = IterationShape(0, 0, 64, 64 * 4096)
    fp16_s = RooflineCostModel(deployment).iteration_time_s(shape)
    fp8_s = RooflineCostModel(_fp8(deployment)).iteration_time_s(shape)
    terms = fp16_terms
    # Half of the KV read (64 x 4,096 tokens) and of the 64 new tokens' KV written.
    kv_s = (64 * 4096 + 64) * fp8_terms.kv_bytes_per_token / terms.bytes_per_s
    assert fp16_s - fp8_s == pytest.approx(kv_s, rel=1e-6)


def test_a_kv_dtype_the_kernels_cannot_store_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"model.kv_dtype='int4': allowed are fp16, bf16, fp8"):
        compose_config("model.kv_dtype=int4")
    cfg, deployment, _ = compose_config("model.kv_dtype=fp8")
    assert cfg.model.kv_dtype == "fp8"
    assert deployment.model.kv_bytes_per_token == 65_536
