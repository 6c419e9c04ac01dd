"""vLLM's KV-cache groups for models whose layers differ in attention, worked by hand.

``core.kv_groups`` restates vLLM's rule (``_get_kv_cache_groups_uniform_page_size``); the peer test
in test_capacity_parity.py compares it with vLLM's own groups for every hybrid catalog model.
"""

from __future__ import annotations

import pytest

from kvbench.core.catalog import get_model
from kvbench.core.kv_groups import KvCacheGroup, kv_group_layout, padding_waste_pct


def test_gemma_3s_five_to_one_pattern_makes_seven_groups_of_ten_layers() -> None:
    model = get_model("gemma-3-27b")
    # (sliding x 5, full) over 62 layers: layers 5, 11, ..., 59 are full: 10 of them.
    assert model.layer_windows[5] is None and model.layer_windows[60] == 1024
    layout = kv_group_layout(model.layer_windows)
    assert layout.group_size == 10
    # 52 sliding layers in ceil(52 / 10) = 6 groups, layers i, i + 6, ...: 9, 9, 9, 9, 8, 8.
    assert layout.groups == (
        *(KvCacheGroup(1024, n) for n in (9, 9, 9, 9, 8, 8)),
        KvCacheGroup(None, 10),
    )
    assert layout.num_padding_layers == 8
    # vLLM: "Add 8 padding layers, may waste at most 15.38% KV cache memory" (8 / 52).
    assert padding_waste_pct(model.layer_windows) == {1024: pytest.approx(100 * 8 / 52)}


@pytest.mark.parametrize(
    ("model", "num_layers_each"),
    [("gemma-2-9b", 21), ("gpt-oss-20b", 12), ("gpt-oss-120b", 18)],
)
def test_a_one_to_one_pattern_makes_two_groups_without_padding(
    model: str, num_layers_each: int
) -> None:
    spec = get_model(model)
    layout = kv_group_layout(spec.layer_windows)
    assert layout.groups == (
        KvCacheGroup(spec.sliding_window, num_layers_each),  # layer 0 slides
        KvCacheGroup(None, num_layers_each),
    )
    assert layout.group_size == num_layers_each and layout.num_padding_layers == 0


def test_a_model_of_one_attention_type_is_one_group_of_all_its_layers() -> None:
    mistral = kv_group_layout(get_model("mistral-7b-v0.1").layer_windows)
    assert mistral.groups == (KvCacheGroup(4096, 32),) and mistral.group_size == 32
    llama = kv_group_layout(get_model("llama-2-70b").layer_windows)
    assert llama.groups == (KvCacheGroup(None, 80),) and llama.is_uniform


def test_close_bucket_sizes_pad_the_smaller_to_the_larger() -> None:
    # 12 sliding + 13 full (gpt-oss-20b with a one-layer draft model): 13 < 1.5 x 12, so the
    # group size is 13 and the sliding bucket gets one padding layer, not the full one 11.
    layout = kv_group_layout([128] * 12 + [None] * 13)
    assert layout.group_size == 13
    assert layout.groups == (KvCacheGroup(128, 12), KvCacheGroup(None, 13))
    # 20 full + 30 sliding: 30 >= 1.5 x 20, so groups of 20: the sliding bucket is two groups
    # (15 + 15 layers) with 10 padding layers, vLLM's "may waste at most 33.33%".
    windows = [None] * 20 + [512] * 30
    assert kv_group_layout(windows).groups == (
        KvCacheGroup(None, 20), KvCacheGroup(512, 15), KvCacheGroup(512, 15),
    )  # fmt: skip
    assert padding_waste_pct(windows) == {512: pytest.approx(100 * 10 / 30)}


def test_a_model_without_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one attention layer"):
        kv_group_layout([])


def test_a_sliding_pattern_without_a_window_is_a_one_line_error() -> None:
    from dataclasses import replace

    model = get_model("gemma-2-9b")
    with pytest.raises(ValueError, match=r"model.sliding_window=None: a sliding layer needs"):
        replace(model, sliding_window=None)
    with pytest.raises(ValueError, match=r"model.attention_pattern=\['local'\]"):
        replace(model, attention_pattern=("local",))
    with pytest.raises(ValueError, match="no layer slides"):
        replace(get_model("llama-3-8b"), sliding_window=4096)


def test_a_bad_attention_setting_is_a_config_error_naming_the_key() -> None:
    from conftest import compose_config

    from kvbench.config import ConfigError

    with pytest.raises(ConfigError, match=r"^model=gemma-2-9b: model.sliding_window=None: a "):
        compose_config("model=gemma-2-9b", "model.sliding_window=null")
    with pytest.raises(ConfigError, match=r"model.attention_pattern=\['full', 'global'\]"):
        compose_config("model=llama-3-8b", "model.attention_pattern=[full,global]")
    # A window on a model of full attention layers, the fix named.
    with pytest.raises(ConfigError, match="set it to null or add 'sliding'"):
        compose_config("model=llama-3-8b", "model.sliding_window=4096")
