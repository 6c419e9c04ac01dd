"""Read a trace file (or a Hugging Face hub dataset) into a DataFrame of its own columns.

Loading goes through the ``datasets`` library, which parses CSV/JSON/parquet with Arrow and
caches the result (a 30k-row CSV: ~0.3 s the first time, ~0.01 s after). Its progress bars and
error logging are silenced while kvbench calls it: a failed load is re-diagnosed and reported as
one TraceError line instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from kvbench.workloads.diagnosis import diagnose_unreadable
from kvbench.workloads.errors import TraceError
from kvbench.workloads.locations import CSV, JSON_LIST, JSONL, PARQUET

_BUILDER_BY_CONTAINER = {CSV: "csv", JSONL: "json", JSON_LIST: "json", PARQUET: "parquet"}
# "TIMESTAMP, ContextTokens": pandas would keep the blank in the name and in values.
_CSV_OPTIONS = {"skipinitialspace": True}


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets

    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets_logger = logging.getLogger("datasets")
    previous_level = datasets_logger.level
    datasets.disable_progress_bars()
    datasets_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        datasets_logger.setLevel(previous_level)
        if not bars_were_disabled:
            datasets.enable_progress_bars()


def read_local_frame(path: Path, container: str) -> pd.DataFrame:
    """All rows of the local file ``path`` with its own column names (stripped of blanks)."""
    import datasets

    options = _CSV_OPTIONS if container == CSV else {}
    try:
        with _quiet_datasets():
            dataset = datasets.load_dataset(
                _BUILDER_BY_CONTAINER[container], data_files=str(path), split="train", **options
            )
    except Exception as error:  # datasets wraps parse errors in several types; diagnose them all
        frame = diagnose_unreadable(path, container, error)
    else:
        frame = dataset.to_pandas()
    frame.columns = [str(name).strip() for name in frame.columns]
    if frame.empty:
        raise TraceError(path, "line 2" if container == CSV else "line 1",
                         "the file holds no data rows", "at least one request")
    return frame


def read_hub_frame(hub_id: str) -> pd.DataFrame:
    """The ``train`` split of a Hugging Face hub dataset (needs network).

    ``hub_id`` is ``owner/name``, optionally followed by ``/path/in/repo`` to pick one data file
    (e.g. ``anon8231489123/ShareGPT_Vicuna_unfiltered/ShareGPT_V3_unfiltered_cleaned_split.json``).
    """
    import datasets

    owner, name, *file_parts = hub_id.split("/")
    data_files = "/".join(file_parts) or None
    # Not silenced: a download deserves its progress bars.
    dataset = datasets.load_dataset(f"{owner}/{name}", data_files=data_files, split="train")
    return dataset.to_pandas()
