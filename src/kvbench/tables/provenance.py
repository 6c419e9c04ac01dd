"""Where a result came from: resolved config, package version, git commit."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import kvbench


@functools.cache
def git_commit() -> str:
    """The commit of kvbench's source tree (``-dirty`` if it has changes), else 'unknown'."""
    source_dir = Path(kvbench.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source_dir, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source_dir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def provenance(cfg: DictConfig | None) -> dict[str, str]:
    """Metadata every written table carries."""
    return {
        "kvbench_version": kvbench.__version__,
        "git_commit": git_commit(),
        "config_yaml": OmegaConf.to_yaml(cfg, resolve=True) if cfg is not None else "",
    }
