"""``python -m kvbench [experiment=NAME] [overrides]``: the Hydra app."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from kvbench.config import ConfigError, check_override_keys, validate_config

EXIT_CONFIG_ERROR = 2
EXIT_INPUT_ERROR = 3


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    try:
        typed_cfg, deployment = validate_config(cfg)
    except ConfigError as error:
        print(f"kvbench: config error: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    # Imported here so that `--help` and config errors answer fast.
    from kvbench.runner import run_experiment

    output_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_experiment(typed_cfg, deployment, cfg, output_dir)
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
