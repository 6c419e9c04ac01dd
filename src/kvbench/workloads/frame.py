"""The typed canonical trace frame: raw columns checked and converted (naming the first bad row
on failure), built into the DataFrame ``load_trace`` returns, and put in arrival order."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvbench.workloads.schema import (
    ARRIVAL_S,
    HASH_BLOCK_TOKENS_ATTR,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PROMPT_TOKENS,
    REQUEST_ID,
    RowLocator,
    TraceError,
    TraceSchema,
    UnsortedTraceWarning,
)

_TOKEN_COUNT = "a non-negative integer token count"

# --- Value checks of the raw columns ---


def require_columns(raw: pd.DataFrame, schema: TraceSchema, locator: RowLocator) -> None:
    """Raise a TraceError naming the columns of ``schema`` that ``raw`` lacks."""
    missing = [name for name in schema.required if name not in raw.columns]
    if missing:
        found = ",".join(map(str, raw.columns))
        raise TraceError(locator.path, locator.header(),
                         f"missing column(s) {','.join(missing)} (found {found})",
                         f"columns {schema.description}")


def _is_blank(values: pd.Series) -> np.ndarray:
    blank = values.isna().to_numpy(dtype=bool, copy=True)
    if values.dtype == object or isinstance(values.dtype, pd.StringDtype):
        blank |= values.astype(str).str.strip().eq("").to_numpy(dtype=bool)
    return blank


def _as_float(values: pd.Series) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        return values.to_numpy(dtype="float64", na_value=np.nan)
    # Text (a file read leniently after a failed load): unparsable values become NaN.
    try:
        numeric = pd.to_numeric(values, errors="coerce")
    except TypeError:  # containers (a JSON list where a number belongs) defeat to_numeric
        numeric = values.map(lambda value: value if isinstance(value, int | float) else np.nan)
    return numeric.to_numpy(dtype="float64", na_value=np.nan)


def _describe(values: pd.Series, column: str, index: int, kind: str) -> str:
    if _is_blank(values.iloc[[index]])[0]:
        return f"{column} is empty"
    raw_value = values.iloc[index]
    shown = repr(raw_value) if isinstance(raw_value, str) else str(raw_value)
    return f"{column} = {shown} is {kind}"


def token_counts(raw: pd.DataFrame, column: str, locator: RowLocator) -> np.ndarray:
    """``raw[column]`` as int64 token counts; a TraceError names the first bad row."""
    values = raw[column]
    if pd.api.types.is_integer_dtype(values) and not values.isna().any():
        counts = values.to_numpy(dtype="int64")
        negative_rows = np.flatnonzero(counts < 0)
        if negative_rows.size:
            index = int(negative_rows[0])
            raise TraceError(locator.path, locator.row(index),
                             f"{column} = {counts[index]} is negative", _TOKEN_COUNT)
        return counts
    as_float = _as_float(values)
    with np.errstate(invalid="ignore"):
        not_integer = ~np.isfinite(as_float) | (as_float != np.floor(as_float))
        negative = as_float < 0
    bad = np.flatnonzero(not_integer | negative)
    if bad.size:
        index = int(bad[0])
        kind = "not an integer" if not_integer[index] else "negative"
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, kind), _TOKEN_COUNT)
    return as_float.astype("int64")


def seconds(raw: pd.DataFrame, column: str, locator: RowLocator, unit_s: float = 1.0) -> np.ndarray:
    """``raw[column]`` times ``unit_s`` as float64 seconds; every row must hold a number >= 0."""
    values = raw[column]
    as_float = _as_float(values)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(as_float) | (as_float < 0))
    if bad.size:
        index = int(bad[0])
        kind = "not a number" if not np.isfinite(as_float[index]) else "negative"
        raise TraceError(locator.path, locator.row(index), _describe(values, column, index, kind),
                         f"a non-negative time ({column} on every row)")
    return as_float * unit_s


def seconds_since_first(raw: pd.DataFrame, column: str, locator: RowLocator) -> np.ndarray:
    """Date-times of ``raw[column]`` as float64 seconds after the earliest of them."""
    values = raw[column]
    stamps = pd.to_datetime(values, format="ISO8601", errors="coerce")
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        index = int(bad[0])
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, "not a date-time"),
                         "a date-time such as 2023-11-16 18:15:46.6805900")
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype="float64")


def block_hash_lists(raw: pd.DataFrame, column: str, locator: RowLocator) -> list[list[int]]:
    """Each row of ``raw[column]`` as a list of Python ints (Mooncake's ``hash_ids``)."""
    hash_lists = []
    for index, cell in enumerate(raw[column]):
        hashes = np.asarray(cell if cell is not None else [None])
        if hashes.ndim != 1 or (hashes.size and hashes.dtype.kind not in "iu"):
            raise TraceError(locator.path, locator.row(index),
                             f"{column} = {cell!r} is not a list of integers",
                             "a list of integer block hashes")
        hash_lists.append(hashes.tolist())
    return hash_lists


def nullable_counts(raw: pd.DataFrame, column: str, locator: RowLocator) -> pd.Series:
    """``raw[column]`` as a nullable Int64 series: empty cells become <NA>, others must be >= 0."""
    values = raw[column]
    present = ~_is_blank(values)
    as_float = _as_float(values)
    with np.errstate(invalid="ignore"):
        bad = present & (~np.isfinite(as_float) | (as_float != np.floor(as_float)) | (as_float < 0))
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, "not a non-negative integer"),
                         "a non-negative integer or an empty cell")
    counts = pd.Series(np.where(present, as_float, 0).astype("int64"), dtype="Int64")
    return counts.mask(~present)


def optional_seconds(raw: pd.DataFrame, column: str, locator: RowLocator) -> np.ndarray | None:
    """Like :func:`seconds`, but a column that is missing or empty on every row means "no
    timestamps" (None); a column filled on some rows only is an error."""
    if column not in raw.columns or _is_blank(raw[column]).all():
        return None
    return seconds(raw, column, locator)


# --- The canonical frame ---


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
