"""Writing a text file atomically (a run's ``report.md``), like the parquet tables."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path``: beside it first, then renamed into place, so a killed
    run never leaves a half-written file where a reader expects a whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp_path.write_text(text, encoding="utf-8")
    os.replace(tmp_path, path)
    return path
