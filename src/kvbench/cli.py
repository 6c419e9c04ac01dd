"""``python -m kvbench [experiment=NAME] [overrides]``: the Hydra app."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from kvbench.config import ConfigError, check_override_keys, validate_config

EXIT_CONFIG_ERROR = 2
EXIT_INPUT_ERROR = 3


def _task(name: str) -> Callable[..., object]:
    """The function that runs ``task=name`` (imported late: config errors answer fast)."""
    if name == "kernel_overhead":
        from kvbench.kernel_overhead import run_kernel_overhead

        return run_kernel_overhead
    from kvbench.runner import run_experiment

    return run_experiment


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    try:
        typed_cfg, deployment = validate_config(cfg)
    except ConfigError as error:
        print(f"kvbench: config error: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        _task(typed_cfg.task)(typed_cfg, deployment, cfg, output_dir)
    except ValueError as error:  # bad input data (a malformed trace, an impossible request)
        print(f"kvbench: input error: {error}", file=sys.stderr)
        sys.exit(EXIT_INPUT_ERROR)


def main() -> None:
    """Console entry point (also ``python -m kvbench``)."""
    overrides = [arg for arg in sys.argv[1:] if not arg.startswith("-") and "=" in arg]
    try:
        check_override_keys(overrides)
    except ConfigError as error:
        print(f"kvbench: config error: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    _app()
