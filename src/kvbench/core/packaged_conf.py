"""The packaged Hydra config (``conf/``, shipped as ``kvbench.conf``) read as plain mappings.

For code not run through Hydra: the catalog's models and GPUs, the deployment defaults that
``catalog.get_deployment`` fills, and root settings the report reuses, so the Python API and the
Hydra app read the same files.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from omegaconf import OmegaConf

CONF_PACKAGE = "kvbench.conf"


def option_names(group: str) -> list[str]:
    """The options of config group ``group`` (``model``, ``hardware``, ...), sorted."""
    folder = files(CONF_PACKAGE) / group
    yaml_names = [p.name for p in folder.iterdir() if p.name.endswith(".yaml")]
    return sorted(name.removesuffix(".yaml") for name in yaml_names)


def read_option(group: str, name: str) -> dict[str, Any]:
    """The values of ``conf/GROUP/NAME.yaml``, resolved, parsed as Hydra parses them.

    Raises ValueError naming the group's options when there is no such file.
    """
    names = option_names(group)
    if name not in names:
        choices = ", ".join(names)
        raise ValueError(f"{group}={name!r} is not in the catalog; choose one of: {choices}")
    text = (files(CONF_PACKAGE) / group / f"{name}.yaml").read_text()
    values = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    if not isinstance(values, dict):
        raise ValueError(f"conf/{group}/{name}.yaml: expected a mapping of settings")
    return {str(key): value for key, value in values.items()}


def root_setting(key: str) -> Any:
    """The value at dotted ``key`` of the root config ``conf/config.yaml`` (unresolved; None when
    absent), e.g. ``knee.latency_multiple``."""
    text = (files(CONF_PACKAGE) / "config.yaml").read_text()
    return OmegaConf.select(OmegaConf.create(text), key, default=None)
