"""The typed canonical trace frame: raw columns checked and converted (naming the first bad row
on failure), built into the DataFrame ``load_trace`` returns, and put in arrival order."""

from __future__ import annotations

import datetime
import re
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
# Token counts are int64: a count from 2**63 up cannot be held (and no request is that long).
_MAX_COUNT_EXCLUSIVE = 2.0**63
# A bad value is quoted in its error up to this length.
_MAX_SHOWN_CHARS = 60
_DATE_TIME = "a date-time such as 2023-11-16 18:15:46.6805900"
_FULL_DATE = re.compile(r"\s*[0-9]{4}-[0-9]{2}-[0-9]{2}")

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
    """``values`` as float64; what is not a number (text, a list, a boolean, a date) becomes NaN."""
    if (pd.api.types.is_bool_dtype(values) or pd.api.types.is_datetime64_any_dtype(values)
            or pd.api.types.is_timedelta64_dtype(values)):  # fmt: skip
        return np.full(len(values), np.nan)
    if pd.api.types.is_numeric_dtype(values):
        return values.to_numpy(dtype="float64", na_value=np.nan)
    # Text (a file read leniently after a failed load) or mixed objects: unparsable -> NaN.
    if values.map(lambda value: isinstance(value, bool | list | dict | np.ndarray)).any():
        return values.map(_number_or_nan).to_numpy(dtype="float64")
    try:
        numeric = pd.to_numeric(values, errors="coerce")
        return numeric.to_numpy(dtype="float64", na_value=np.nan)
    except (TypeError, ValueError, OverflowError):  # objects to_numeric cannot take
        return values.map(_number_or_nan).to_numpy(dtype="float64")


def _number_or_nan(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str | np.number):
        return np.nan
    try:
        return float(value)
    except (ValueError, OverflowError):
        return np.nan


def _describe(values: pd.Series, column: str, index: int, kind: str) -> str:
    if _is_blank(values.iloc[[index]])[0]:
        return f"{column} is empty"
    return f"{column} = {shown(values.iloc[index])} is {kind}"


def shown(value: object) -> str:
    """``value`` as an error message quotes it: text in quotes, anything else as printed, cut
    after ``_MAX_SHOWN_CHARS`` (a whole text or list helps nobody)."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 3] + "..."


def token_counts(
    raw: pd.DataFrame, column: str, locator: RowLocator, expected: str = _TOKEN_COUNT
) -> np.ndarray:
    """``raw[column]`` as int64 token counts (or other non-negative integers, ``expected``
    naming them); a TraceError names the first bad row."""
    values = raw[column]
    if pd.api.types.is_signed_integer_dtype(values) and not values.isna().any():
        counts = values.to_numpy(dtype="int64")
        negative_rows = np.flatnonzero(counts < 0)
        if negative_rows.size:
            index = int(negative_rows[0])
            raise TraceError(locator.path, locator.row(index),
                             f"{column} = {counts[index]} is negative", expected)
        return counts
    as_float = _as_float(values)
    with np.errstate(invalid="ignore"):
        not_integer = ~np.isfinite(as_float) | (as_float != np.floor(as_float))
        negative = as_float < 0
        too_large = as_float >= _MAX_COUNT_EXCLUSIVE
    bad = np.flatnonzero(not_integer | negative | too_large)
    if bad.size:
        index = int(bad[0])
        kind = ("not an integer" if not_integer[index] else "negative" if negative[index]
                else "too large (2**63 tokens or more)")  # fmt: skip
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, kind), expected)
    if pd.api.types.is_unsigned_integer_dtype(values):  # exact: float64 rounds past 2**53
        return values.to_numpy(dtype="int64")
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
    stamps = _date_times(values, column, locator)
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        index = int(bad[0])
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, "not a date-time"), _DATE_TIME)
    try:
        return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype="float64")
    except (OverflowError, pd.errors.OutOfBoundsTimedelta):  # centuries apart: no ns timedelta
        index = int(np.argmax(stamps.to_numpy()))
        raise TraceError(locator.path, locator.row(index),
                         _describe(values, column, index, "centuries after the first"),
                         f"{_DATE_TIME}, all within 292 years") from None


def _date_times(values: pd.Series, column: str, locator: RowLocator) -> pd.Series:
    """``values`` parsed as date-times (NaT where not one); a TraceError names a row whose
    time zone differs from the others' (pandas cannot hold both in one column)."""
    try:
        stamps = pd.to_datetime(values, format="ISO8601", errors="coerce")
    except (TypeError, ValueError, OverflowError):  # mixed time zones, or objects it refuses
        pass
    else:
        return stamps.where(_has_full_date(values))
    parsed = [_date_time(value) for value in values]
    for row, stamp in enumerate(parsed):
        if stamp is pd.NaT:
            raise TraceError(locator.path, locator.row(row),
                             _describe(values, column, row, "not a date-time"), _DATE_TIME)
    zones = [str(stamp.tzinfo) for stamp in parsed]
    other_zone = next((i for i, zone in enumerate(zones) if zone != zones[0]), None)
    if other_zone is None:  # each reads alone, not all together: name the column's first row
        raise TraceError(locator.path, locator.row(0),
                         f"{column} holds date-times pandas cannot read together", _DATE_TIME)
    raise TraceError(locator.path, locator.row(other_zone),
                     _describe(values, column, other_zone, f"in another time zone than {column} "
                               f"on {locator.row(0)}"), f"{_DATE_TIME}, all in one time zone")


def _has_full_date(values: pd.Series) -> pd.Series:
    """Which values name a calendar date: date-time values, or text that starts with
    ``YYYY-MM-DD``. ISO 8601 also reads a bare year ("2023") or a signed one ("-3", the year 4 BC)
    as a time, but in a trace such a cell is a number in the wrong column, not an arrival."""
    if pd.api.types.is_datetime64_any_dtype(values):
        return pd.Series(True, index=values.index)
    return values.map(_names_a_date)


def _names_a_date(value: object) -> bool:
    if isinstance(value, str):
        return _FULL_DATE.match(value) is not None
    return isinstance(value, datetime.datetime)


def _date_time(value: object) -> pd.Timestamp:
    if not _has_full_date(pd.Series([value], dtype=object)).iloc[0]:
        return pd.NaT
    try:
        stamp = pd.to_datetime(value, format="ISO8601")
    except (TypeError, ValueError, OverflowError):
        return pd.NaT
    return stamp if isinstance(stamp, pd.Timestamp) else pd.NaT


def block_hash_lists(raw: pd.DataFrame, column: str, locator: RowLocator) -> list[list[int]]:
    """Each row of ``raw[column]`` as a list of Python ints (Mooncake's ``hash_ids``)."""
    hash_lists = []
    for index, cell in enumerate(raw[column]):
        try:
            hashes = np.asarray(cell if cell is not None else [None])
        except ValueError:  # ragged nesting
            hashes = np.asarray([None])
        if hashes.ndim != 1 or (hashes.size and hashes.dtype.kind not in "iu"):
            raise TraceError(locator.path, locator.row(index),
                             _describe(raw[column], column, index, "not a list of integers"),
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
