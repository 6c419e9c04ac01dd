"""The catalog reproduces the vLLM paper's Table 1 and the Llama-2-70B KV size."""

import pytest

from kvbench.core.catalog import get_deployment, get_model, hardware_names, model_names
from kvbench.core.specs import GIB

REQUIRED_MODELS = {
    "opt-13b", "opt-66b", "opt-175b", "llama-13b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
    "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b",
}  # fmt: skip
REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "l40s"}


def test_catalog_lists_the_required_models_and_gpus():
    assert set(model_names()) >= REQUIRED_MODELS
    assert set(hardware_names()) >= REQUIRED_GPUS


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [
        ("opt-13b", 819_200),
        ("opt-66b", 2_359_296),
        ("opt-175b", 4_718_592),
        ("llama-13b", 819_200),
        ("llama-2-70b", 327_680),
    ],
)
def test_kv_bytes_per_token_match_the_paper(name, kv_bytes_per_token):
    assert get_model(name).kv_bytes_per_token == kv_bytes_per_token


def test_table1_opt13b_on_one_a100_40gb():
    # 40 GB GPU, 26 GB of weights (the paper's figure), 12 GB left for KV -> 15.7K slots.
    deployment = get_deployment("opt-13b", "a100-40gb", num_gpus=1, kv_cache_gib=12)
    model = deployment.model
    assert deployment.kv_bytes_per_token == 800 * 1024  # 800 KiB per token
    assert deployment.num_kv_slots == 15_728
    assert round(deployment.num_kv_slots / 1000, 1) == 15.7
    # The paper's "26 GB" of parameters: 12.85e9 fp16 parameters = 25.7 GB.
    assert round(model.weight_bytes / 1e9) == 26


def test_table1_opt175b_on_eight_a100_80gb():
    deployment = get_deployment(
        "opt-175b", "a100-80gb", num_gpus=8, kv_cache_gib=264, gpu_memory_utilization=1.0
    )
    assert round(deployment.num_kv_slots / 1000, 1) == 60.1
    deployment.check_fits()


def test_capacity_from_memory_weights_and_reserve():
    deployment = get_deployment(
        "llama-2-70b", "a100-80gb", num_gpus=4, gpu_memory_utilization=0.9,
        activation_reserve_gib=1.0,
    )  # fmt: skip
    model = deployment.model
    expected_bytes = 4 * (80 * 0.9 - 1.0) * GIB - model.weight_bytes
    assert deployment.num_kv_slots == int(expected_bytes // 327_680)
    assert deployment.num_kv_blocks(16) == deployment.num_kv_slots // 16


def test_gqa_heads_are_replicated_when_gpus_outnumber_them():
    wide = get_deployment("llama-3.1-405b", "h200-141gb", num_gpus=16)
    model = wide.model  # 8 KV heads
    assert wide.kv_bytes_per_token == 2 * model.kv_bytes_per_token


def test_a_model_that_does_not_fit_names_the_fix():
    deployment = get_deployment("llama-2-70b", "a100-80gb", num_gpus=1)
    with pytest.raises(ValueError, match=r"llama-2-70b does not fit .*hardware.num_gpus=2"):
        deployment.check_fits()


def test_unknown_catalog_entry_lists_the_choices():
    with pytest.raises(ValueError, match="opt-13b"):
        get_model("gpt-5")
