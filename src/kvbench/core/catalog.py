"""The catalog of models and GPUs, read from the packaged Hydra config groups.

``conf/model/*.yaml`` and ``conf/hardware/*.yaml`` are the single source of the figures, and
``conf/deployment/default.yaml`` of the deployment settings; this module turns them into
``ModelSpec``/``HardwareSpec``/``Deployment`` for code that is not run through Hydra, sizing the
same pool as the Hydra app for the same names. It is the one place the Python API reads those
defaults (``specs`` holds none, so the engine stays free of file reads).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from kvbench.core.packaged_conf import option_names, read_option
from kvbench.core.specs import Deployment, HardwareSpec, ModelSpec

# The Deployment settings a `hardware` config node may carry beside the GPU's figures.
DEPLOYMENT_KEYS = ("num_gpus", "gpu_memory_utilization", "activation_reserve_gib", "kv_cache_gib")


def model_names() -> list[str]:
    """Names accepted by ``model=NAME``."""
    return option_names("model")


def hardware_names() -> list[str]:
    """Names accepted by ``hardware=NAME``."""
    return option_names("hardware")


def model_spec_from(values: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from a config mapping (extra keys ignored, numbers coerced)."""
    spec_fields = {f.name for f in fields(ModelSpec)}
    kwargs = {k: v for k, v in values.items() if k in spec_fields}
    for key in ("num_parameters", "num_active_parameters"):
        if kwargs.get(key) is not None:
            kwargs[key] = float(kwargs[key])
    if "attention_pattern" in kwargs:  # a YAML list; the spec is frozen (hashable)
        kwargs["attention_pattern"] = tuple(kwargs["attention_pattern"])
    return ModelSpec(**kwargs)


def hardware_spec_from(values: dict[str, Any]) -> HardwareSpec:
    """A HardwareSpec from a config mapping (deployment keys ignored, numbers coerced)."""
    return HardwareSpec(
        name=str(values["name"]),
        memory_gib=float(values["memory_gib"]),
        hbm_bandwidth_gb_per_s=float(values["hbm_bandwidth_gb_per_s"]),
        peak_tflops=float(values["peak_tflops"]),
        pcie_gb_per_s=float(values["pcie_gb_per_s"]),
    )


def hf_kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a Hugging Face model config (any object with its
    attributes: a transformers ``PretrainedConfig``, or ``config.json`` read into a namespace):
    head dim is ``head_dim`` where given, else hidden size / attention heads; KV heads default to
    the attention heads (no grouped-query attention)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers, num_kv_heads, head_dim


def get_model(name: str) -> ModelSpec:
    """The catalog's ModelSpec called ``name`` (e.g. ``llama-2-70b``)."""
    return model_spec_from(read_option("model", name))


def get_hardware(name: str) -> HardwareSpec:
    """The catalog's HardwareSpec called ``name`` (e.g. ``a100-80gb``)."""
    return hardware_spec_from(read_option("hardware", name))


def deployment_from(model_values: dict[str, Any], hardware_values: dict[str, Any]) -> Deployment:
    """A Deployment from the ``model`` and ``hardware`` config nodes.

    The hardware node must hold every deployment setting (``DEPLOYMENT_KEYS``), as the Hydra app's
    does once ``conf/deployment/default.yaml`` is mounted under it; raises ValueError naming the
    first one missing.
    """
    missing = [key for key in DEPLOYMENT_KEYS if key not in hardware_values]
    if missing:
        raise ValueError(f"hardware.{missing[0]} is not set; a deployment needs "
                         f"{', '.join(DEPLOYMENT_KEYS)}")  # fmt: skip
    kv_cache_gib = hardware_values["kv_cache_gib"]
    return Deployment(
        model=model_spec_from(model_values),
        hardware=hardware_spec_from(hardware_values),
        num_gpus=int(hardware_values["num_gpus"]),
        gpu_memory_utilization=float(hardware_values["gpu_memory_utilization"]),
        activation_reserve_gib=float(hardware_values["activation_reserve_gib"]),
        kv_cache_gib=None if kv_cache_gib is None else float(kv_cache_gib),
    )


def get_deployment(model: str, hardware: str, **settings: Any) -> Deployment:
    """The Deployment that ``model=MODEL hardware=HARDWARE hardware.KEY=VALUE...`` runs.

    ``settings`` are deployment settings (``num_gpus``, ``gpu_memory_utilization``,
    ``activation_reserve_gib``, ``kv_cache_gib``); the rest come from the hardware's file, then
    ``conf/deployment/default.yaml``, in the Hydra app's order. This is the Python API's way to a
    Deployment by name: ``Deployment`` itself has no defaults.
    """
    unknown = sorted(set(settings) - set(DEPLOYMENT_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a deployment setting; expected one of "
                         f"{', '.join(DEPLOYMENT_KEYS)}")  # fmt: skip
    # Later wins, as in the root config's defaults list: deployment@hardware, then hardware=NAME.
    hardware_values = {
        **read_option("deployment", "default"),
        **read_option("hardware", hardware),
        **settings,
    }
    return deployment_from(read_option("model", model), hardware_values)
