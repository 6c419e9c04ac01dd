"""Build the canonical trace DataFrame and put its rows in arrival order."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvbench.workloads.columns import (
    ARRIVAL_S,
    HASH_BLOCK_TOKENS_ATTR,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PROMPT_TOKENS,
    REQUEST_ID,
)
from kvbench.workloads.errors import UnsortedTraceWarning
from kvbench.workloads.locations import RowLocator


def trace_frame(
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    arrival_s: np.ndarray | None = None,
    request_ids: np.ndarray | None = None,
    prefix_block_hashes: Sequence[list[int]] | None = None,
    hash_block_tokens: int = 0,
) -> pd.DataFrame:
    """The canonical trace DataFrame (column order and dtypes of ``load_trace``).

    ``request_ids`` default to the row positions; ``arrival_s`` to NaN (no timestamps).
    """
    num_rows = len(prompt_tokens)
    columns = {
        REQUEST_ID: np.arange(num_rows) if request_ids is None else request_ids,
        ARRIVAL_S: np.full(num_rows, np.nan) if arrival_s is None else arrival_s,
        PROMPT_TOKENS: prompt_tokens,
        OUTPUT_TOKENS: output_tokens,
    }
    frame = pd.DataFrame(columns).astype(
        {REQUEST_ID: "int64", ARRIVAL_S: "float64", PROMPT_TOKENS: "int64", OUTPUT_TOKENS: "int64"}
    )
    if prefix_block_hashes is not None:
        frame[PREFIX_BLOCK_HASHES] = pd.Series(list(prefix_block_hashes), dtype=object)
        frame.attrs[HASH_BLOCK_TOKENS_ATTR] = int(hash_block_tokens)
    return frame


def sort_by_arrival(frame: pd.DataFrame, locator: RowLocator) -> pd.DataFrame:
    """``frame`` in arrival order, stably; warns (UnsortedTraceWarning) when it had to reorder.

    Rows keep their ``request_id`` (the source row), so a reordered trace can be traced back.
    Frames without timestamps (all NaN) are returned as they are.
    """
    arrival_s = frame[ARRIVAL_S].to_numpy()
    backwards = np.flatnonzero(arrival_s[1:] < arrival_s[:-1])
    if backwards.size == 0:
        return frame
    first_index = int(backwards[0]) + 1
    warnings.warn(
        f"{locator.path}: {locator.row(first_index)}: arrival goes back in time "
        f"({backwards.size} row(s) earlier than the row above); rows were sorted stably by "
        f"{ARRIVAL_S} and keep their {REQUEST_ID}",
        UnsortedTraceWarning,
        stacklevel=3,
    )
    attrs = dict(frame.attrs)
    ordered = frame.sort_values(ARRIVAL_S, kind="stable").reset_index(drop=True)
    ordered.attrs = attrs
    return ordered
