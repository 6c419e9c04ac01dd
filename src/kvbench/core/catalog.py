"""The catalog of models and GPUs, read from the packaged Hydra config groups.

``conf/model/*.yaml`` and ``conf/hardware/*.yaml`` are the single source of the figures, and
``conf/deployment/default.yaml`` of the deployment settings; this module turns them into
``ModelSpec``/``HardwareSpec``/``Deployment`` for code that is not run through Hydra, sizing the
same pool as the Hydra app for the same names.
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


def get_model(name: str) -> ModelSpec:
    """The catalog's ModelSpec called ``name`` (e.g. ``llama-2-70b``)."""
    return model_spec_from(read_option("model", name))


def get_hardware(name: str) -> HardwareSpec:
    """The catalog's HardwareSpec called ``name`` (e.g. ``a100-80gb``)."""
    return hardware_spec_from(read_option("hardware", name))


def deployment_from(model_values: dict[str, Any], hardware_values: dict[str, Any]) -> Deployment:
    """A Deployment from the ``model`` and ``hardware`` config nodes.

    A deployment setting the node lacks takes ``Deployment``'s default, which is
    ``conf/deployment/default.yaml``'s (as in the Hydra app).
    """
    settings = {key: hardware_values[key] for key in DEPLOYMENT_KEYS if key in hardware_values}
    if "num_gpus" in settings:
        settings["num_gpus"] = int(settings["num_gpus"])
    for key in ("gpu_memory_utilization", "activation_reserve_gib", "kv_cache_gib"):
        if settings.get(key) is not None:
            settings[key] = float(settings[key])
    model = model_spec_from(model_values)
    return Deployment(model=model, hardware=hardware_spec_from(hardware_values), **settings)


def get_deployment(model: str, hardware: str, **settings: Any) -> Deployment:
    """The Deployment that ``model=MODEL hardware=HARDWARE hardware.KEY=VALUE...`` runs.

    ``settings`` are deployment settings (``num_gpus``, ``gpu_memory_utilization``,
    ``activation_reserve_gib``, ``kv_cache_gib``); the rest come from the hardware's file, then
    ``conf/deployment/default.yaml``, in the Hydra app's order.
    """
    unknown = sorted(set(settings) - set(DEPLOYMENT_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a deployment setting; expected one of "
                         f"{', '.join(DEPLOYMENT_KEYS)}")  # fmt: skip
    hardware_values = {**read_option("hardware", hardware), **settings}
    return deployment_from(read_option("model", model), hardware_values)
