"""A deployment's KV pool as vLLM's own sizing code computes it (``vllm.v1.core.kv_cache_utils``).

The model is described to vLLM by a ``config.json`` of its catalog figures (layers, heads, KV heads,
head dim, dtype), so vLLM itself decides each GPU's share of the KV heads under tensor parallelism
(``ModelConfig.get_num_kv_heads``); every layer gets a ``FullAttentionSpec``, and
``get_kv_cache_groups``, ``get_kv_cache_config_from_groups`` and ``get_kv_cache_capacity`` size the
pool from one GPU's share of the KV memory, as each vLLM worker does. With ``hybrid=True`` a
sliding-window layer gets a ``SlidingWindowSpec`` of the catalog's window instead, in the model's
own pattern, so vLLM's hybrid KV-cache manager builds its groups (``paged_hybrid``'s pool); without,
every layer is full attention, as vLLM with ``--disable-hybrid-kv-cache-manager`` (``paged``'s).
"""

from __future__ import annotations

from typing import Any

from kvbench.core.kv_capacity import VllmStartupFigures
from kvbench.core.specs import Deployment
from kvbench.referee.vllm_v1 import RefereeLimits, _import_vllm, _model_config, vllm_config

# vLLM's names for kvbench's dtypes.
_TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}


def vllm_kv_cache_config(
    deployment: Deployment,
    block_size: int,
    num_gpu_blocks_override: int | None = None,
    *,
    hybrid: bool = False,
) -> tuple[Any, Any]:
    """(VllmConfig, KVCacheConfig) vLLM builds for one GPU of ``deployment``.

    Each GPU is given ``deployment.kv_cache_bytes / num_gpus`` bytes (whole bytes), the KV memory
    kvbench sizes its pool from. ``hybrid``: sliding-window layers keep their window (module doc).
    """
    vllm = _import_vllm()
    from vllm.config import ParallelConfig
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    model = deployment.model
    limits = RefereeLimits(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks_override or 1,
        max_num_seqs=256,
        max_num_batched_tokens=max(model.max_model_len, 2048),
        max_model_len=model.max_model_len,
        enable_prefix_caching=True,
    )
    config = vllm_config(limits, **_config_json(deployment))
    config.cache_config.num_gpu_blocks_override = num_gpu_blocks_override
    # The engine core resolves the layout from the attention backend; FlashAttention's default
    # (NHD, i.e. LBNHC). For full attention every layout gives the same bytes per block.
    config.cache_config.kv_cache_layout = "LBNHC"
    model_config = _model_config(model.max_model_len, _config_key(deployment))
    parallel = ParallelConfig(tensor_parallel_size=deployment.num_gpus)
    # vLLM's cache_dtype=fp8 stores K/V in one byte (its spec's dtype), whatever the weights'.
    if model.kv_dtype == "fp8":
        config.cache_config.cache_dtype = "fp8"
    dtype = getattr(vllm.torch, _TORCH_DTYPES[model.kv_dtype or model.dtype])
    page = {
        "block_size": block_size,
        "num_kv_heads": model_config.get_num_kv_heads(parallel),
        "head_size": model_config.get_head_size(),
        "dtype": dtype,
    }
    full_spec = vllm.FullAttentionSpec(**page)
    windows = model.layer_windows if hybrid else (None,) * model.num_layers
    assert len(windows) == model_config.get_num_layers(parallel)
    layer_specs = {
        f"model.layers.{layer}.self_attn.attn": (
            full_spec if window is None else SlidingWindowSpec(**page, sliding_window=window)
        )
        for layer, window in enumerate(windows)
    }
    groups = get_kv_cache_groups(config, layer_specs)
    per_gpu_bytes = int(deployment.kv_cache_bytes // deployment.num_gpus)
    return config, get_kv_cache_config_from_groups(config, groups, per_gpu_bytes)


def vllm_num_gpu_blocks(
    deployment: Deployment,
    block_size: int,
    num_gpu_blocks_override: int | None = None,
    *,
    hybrid: bool = False,
) -> int:
    """vLLM's ``num_blocks`` for ``deployment`` (the null block included)."""
    _, kv_cache_config = vllm_kv_cache_config(
        deployment, block_size, num_gpu_blocks_override, hybrid=hybrid
    )
    return int(kv_cache_config.num_blocks)


def vllm_group_layer_counts(
    deployment: Deployment, block_size: int
) -> list[tuple[int | None, int]]:
    """(window, layers) of each KV-cache group vLLM's hybrid manager builds (None: full)."""
    _, kv_cache_config = vllm_kv_cache_config(deployment, block_size, hybrid=True)
    return [
        (getattr(group.kv_cache_spec, "sliding_window", None), len(group.layer_names))
        for group in kv_cache_config.kv_cache_groups
    ]


def vllm_startup_figures_of(
    deployment: Deployment,
    block_size: int,
    num_gpu_blocks_override: int | None = None,
    *,
    hybrid: bool = False,
) -> VllmStartupFigures:
    """The two figures vLLM logs at startup, computed by vLLM's ``get_kv_cache_capacity``."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    config, kv_cache_config = vllm_kv_cache_config(
        deployment, block_size, num_gpu_blocks_override, hybrid=hybrid
    )
    num_tokens, max_concurrency = get_kv_cache_capacity(config, kv_cache_config)
    return VllmStartupFigures(
        kv_cache_size_tokens=int(num_tokens),
        max_concurrency=float(max_concurrency),
        max_model_len=int(config.model_config.max_model_len),
    )


def _config_json(deployment: Deployment) -> dict[str, Any]:
    model = deployment.model
    return {
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "hidden_size": model.hidden_size,
        "torch_dtype": _TORCH_DTYPES[model.dtype] if model.dtype != "fp8" else "float16",
    }


def _config_key(deployment: Deployment) -> str:
    import json

    return json.dumps(_config_json(deployment), sort_keys=True)
