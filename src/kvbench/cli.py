"""``python -m kvbench [experiment=NAME] [overrides]``: the Hydra app."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvbench.config import ConfigError, check_override_keys, validate_config
from kvbench.tables.atomic import file_error_text
from kvbench.tables.done_marker import (
    config_fingerprint,
    is_done,
    job_dir_name,
    mark_done,
    start_run,
)

EXIT_CONFIG_ERROR = 2
EXIT_INPUT_ERROR = 3
EXIT_FILE_ERROR = 4


def _task(name: str) -> Callable[..., object]:
    """The function that runs ``task=name`` (imported late: config errors answer fast)."""
    if name == "kernel_overhead":
        from kvbench.tasks.kernel_overhead.run import run_kernel_overhead

        return run_kernel_overhead
    if name == "logit_equivalence":
        from kvbench.tasks.equivalence.run import run_logit_equivalence

        return run_logit_equivalence
    from kvbench.tasks.simulate.run import run_study

    return run_study


# hydra.sweep.subdir in conf/config.yaml; registered at import, so also in the launcher's workers.
OmegaConf.register_new_resolver("kvbench_job_dir", job_dir_name, replace=True)


@hydra.main(version_base="1.3", config_path="pkg://kvbench.conf", config_name="config")
def _app(cfg: DictConfig) -> None:
    try:
        typed_cfg, deployment = validate_config(cfg)
    except ConfigError as error:
        print(f"kvbench: config error: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    fingerprint = config_fingerprint(cfg)
    if typed_cfg.skip_done and is_done(output_dir, fingerprint):
        print(f"kvbench: {output_dir} is complete (DONE, same config): skipped; "
              "skip_done=false runs it again")  # fmt: skip
        return
    started_s = time.perf_counter()
    try:
        start_run(output_dir)  # no DONE while the folder holds a mix; a killed run's temporaries go
        _task(typed_cfg.task)(typed_cfg, deployment, cfg, output_dir)
        mark_done(output_dir, fingerprint, time.perf_counter() - started_s)
    except ValueError as error:  # bad input data (a malformed trace, an impossible request)
        print(f"kvbench: input error: {error}", file=sys.stderr)
        sys.exit(EXIT_INPUT_ERROR)
    except OSError as error:  # a file missing, unreadable or unwritable, a full disk
        print(f"kvbench: file error: {file_error_text(error)}", file=sys.stderr)
        sys.exit(EXIT_FILE_ERROR)


def main() -> None:
    """Console entry point (also ``python -m kvbench``)."""
    overrides = [arg for arg in sys.argv[1:] if not arg.startswith("-") and "=" in arg]
    try:
        check_override_keys(overrides)
    except ConfigError as error:
        print(f"kvbench: config error: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    _app()
