"""The DONE marker: a run's last write, so that a re-run sweep skips the jobs that finished.

A run writes its tables atomically as it goes (``kvbench.tables.parquet.write_table``) and, once
everything is written, ``DONE``: a small JSON file with the fingerprint of the config that produced
the folder. A job killed before the end has no DONE (and no half-written parquet), so a re-run
redoes it; a folder whose DONE carries another fingerprint (the sweep changed) is redone too.
A run that starts in a folder first removes its DONE (``start_run``): while it writes, the folder
holds a mix of old and new tables, and nothing may call that mix complete.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvbench.tables.atomic import atomic_path, remove_stale_temporaries

DONE_NAME = "DONE"
# Longest sweep folder name kept as is (file systems cap a name at 255 bytes).
MAX_JOB_DIR_CHARS = 200
# Keys that change how a run reports, not what it computes.
NOT_FINGERPRINTED = ("progress", "skip_done", "summary_table")


def config_fingerprint(cfg: DictConfig) -> str:
    """SHA-256 of the resolved config, less ``NOT_FINGERPRINTED`` keys and Hydra's own node."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    for key in (*NOT_FINGERPRINTED, "hydra"):
        values.pop(key, None)
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def is_done(output_dir: Path, fingerprint: str) -> bool:
    """True when ``output_dir`` holds a DONE marker written for ``fingerprint``."""
    try:
        marker = json.loads((output_dir / DONE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("config_sha256") == fingerprint


def mark_done(output_dir: Path, fingerprint: str, wall_s: float) -> Path:
    """Write the DONE marker atomically (beside it, flushed, then renamed into place)."""
    path = output_dir / DONE_NAME
    marker = {"config_sha256": fingerprint, "wall_s": round(wall_s, 3),
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    with atomic_path(path) as tmp_path:
        tmp_path.write_text(json.dumps(marker) + "\n")
    return path


def start_run(output_dir: Path) -> None:
    """Before a run writes in ``output_dir``: remove its DONE marker (the folder is no longer
    complete) and the temporary files a killed run left there."""
    (output_dir / DONE_NAME).unlink(missing_ok=True)
    if output_dir.is_dir():
        remove_stale_temporaries(output_dir)


def job_dir_name(override_dirname: str) -> str:
    """A multirun job's folder: its overrides (``a=1,b=2``), or, when longer than
    ``MAX_JOB_DIR_CHARS``, their head and a hash of the whole, so it stays unique and legal."""
    if override_dirname and len(override_dirname) <= MAX_JOB_DIR_CHARS:
        return override_dirname
    digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:12]
    head = override_dirname[: MAX_JOB_DIR_CHARS - 13].replace("/", "_")
    return f"{head}-{digest}" if head else f"job-{digest}"
