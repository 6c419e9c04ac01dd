"""Find and load every run under result folders: one run's or a whole multirun's.

A run folder is any folder holding a ``summary.parquet`` (a Hydra run, a multirun job, a grid
point of a study); its ``DONE`` marker, or that of a folder above it (a study writes one DONE for
all its grid points), says it finished.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kvbench.tables.done_marker import DONE_NAME

SUMMARY_NAME = "summary.parquet"


def find_tables(roots: Iterable[Path], name: str = SUMMARY_NAME) -> list[Path]:
    """Every file called ``name`` under ``roots`` (each once, in a stable order)."""
    found: dict[Path, None] = {}
    for root in roots:
        candidates = [root] if root.is_file() else sorted(root.rglob(name))
        for path in candidates:
            if path.name == name:
                found.setdefault(path.resolve(), None)
    return list(found)


def is_complete(run_dir: Path) -> bool:
    """Whether ``run_dir`` or a folder above it holds a DONE marker."""
    return any((folder / DONE_NAME).exists() for folder in (run_dir, *run_dir.parents))


class UnreadableTableWarning(UserWarning):
    """A table under the report's folders that could not be read, left out of the report."""


def load_tables(roots: Iterable[Path], name: str = SUMMARY_NAME) -> pd.DataFrame:
    """Every ``name`` table under ``roots``, concatenated, with ``run_dir`` and ``run_complete``.

    A file that cannot be read as parquet (a run killed while writing it, a truncated copy) is
    left out with a warning naming it, so one damaged run does not hide the others.
    """
    frames = []
    for path in find_tables(roots, name):
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            reason = " ".join(str(error).split())[:200]
            warnings.warn(f"{path}: left out, not a readable parquet table ({reason})",
                          UnreadableTableWarning, stacklevel=2)  # fmt: skip
            continue
        if not frame.empty:
            frames.append(frame.assign(run_dir=str(path.parent),
                                       run_complete=is_complete(path.parent)))  # fmt: skip
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_summaries(roots: Iterable[Path | str]) -> pd.DataFrame:
    """Every summary row under ``roots`` (``summary.parquet`` files, searched recursively)."""
    return load_tables([Path(root) for root in roots], SUMMARY_NAME)


def done_marker(run_dir: Path) -> tuple[str, float] | None:
    """The nearest DONE marker at or above ``run_dir``: (its path, the run's wall seconds)."""
    for folder in (run_dir, *run_dir.parents):
        marker = folder / DONE_NAME
        if marker.exists():
            try:
                wall_s = float(json.loads(marker.read_text()).get("wall_s", "nan"))
            except (OSError, ValueError):
                wall_s = float("nan")
            return str(marker), wall_s
    return None
