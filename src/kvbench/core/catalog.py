"""The catalog of models and GPUs, read from the packaged Hydra config groups.

``conf/model/*.yaml`` and ``conf/hardware/*.yaml`` are the single source of the figures; this
module turns them into ``ModelSpec``/``HardwareSpec`` for code that is not run through Hydra.
"""

from __future__ import annotations

from dataclasses import fields
from importlib.resources import files
from typing import Any

from omegaconf import OmegaConf

from kvbench.core.specs import Deployment, HardwareSpec, ModelSpec

_CONF_PACKAGE = "kvbench.conf"


def _group_names(group: str) -> list[str]:
    folder = files(_CONF_PACKAGE) / group
    yaml_names = [p.name for p in folder.iterdir() if p.name.endswith(".yaml")]
    return sorted(name.removesuffix(".yaml") for name in yaml_names)


def _load_entry(group: str, name: str) -> dict[str, Any]:
    names = _group_names(group)
    if name not in names:
        choices = ", ".join(names)
        raise ValueError(f"{group}={name!r} is not in the catalog; choose one of: {choices}")
    text = (files(_CONF_PACKAGE) / group / f"{name}.yaml").read_text()
    return OmegaConf.to_container(OmegaConf.create(text), resolve=True)  # type: ignore[return-value]


def model_names() -> list[str]:
    """Names accepted by ``model=NAME``."""
    return _group_names("model")


def hardware_names() -> list[str]:
    """Names accepted by ``hardware=NAME``."""
    return _group_names("hardware")


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
    spec_fields = {f.name: f for f in fields(HardwareSpec)}
    kwargs = {k: (v if k == "name" else float(v)) for k, v in values.items() if k in spec_fields}
    return HardwareSpec(**kwargs)


def get_model(name: str) -> ModelSpec:
    """The catalog's ModelSpec called ``name`` (e.g. ``llama-2-70b``)."""
    return model_spec_from(_load_entry("model", name))


def get_hardware(name: str) -> HardwareSpec:
    """The catalog's HardwareSpec called ``name`` (e.g. ``a100-80gb``)."""
    return hardware_spec_from(_load_entry("hardware", name))


def deployment_from(model_values: dict[str, Any], hardware_values: dict[str, Any]) -> Deployment:
    """A Deployment from the ``model`` and ``hardware`` config nodes."""
    kv_cache_gib = hardware_values.get("kv_cache_gib")
    return Deployment(
        model=model_spec_from(model_values),
        hardware=hardware_spec_from(hardware_values),
        num_gpus=int(hardware_values.get("num_gpus", 1)),
        gpu_memory_utilization=float(hardware_values.get("gpu_memory_utilization", 0.9)),
        activation_reserve_gib=float(hardware_values.get("activation_reserve_gib", 0.0)),
        kv_cache_gib=None if kv_cache_gib is None else float(kv_cache_gib),
    )
