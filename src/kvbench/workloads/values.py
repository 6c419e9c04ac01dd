"""Check and convert the value columns of a raw trace, naming the first bad row on failure."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.workloads.errors import TraceError
from kvbench.workloads.locations import RowLocator
from kvbench.workloads.schemas import TraceSchema

_TOKEN_COUNT = "a non-negative integer token count"


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
        negative = np.flatnonzero(counts < 0)
        if negative.size:
            index = int(negative[0])
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
