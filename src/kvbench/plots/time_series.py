"""Long time series thinned to what a chart can show (no matplotlib here: the tasks thin a run's
steps before they keep them for a chart).

A run of the Azure trace has 130,000-220,000 iterations and a million-request run 3,000,000; a
chart about 1,000 pixels wide shows at most two values per pixel column, its lowest and its
highest. ``envelope_rows`` keeps, per bucket of equal width in x (about a pixel), the rows holding
each series' minimum and maximum, plus the first and last rows: every peak and trough a full
drawing shows stays, at a few thousand points per line instead of hundreds of thousands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

# Buckets across a chart's x axis: about one per pixel column of an 8-inch chart at 120 dpi.
CHART_BUCKETS = 1000
# The memory-over-time chart: x, its two lines per run, and the columns that tell runs apart.
MEMORY_X = "time_s"
MEMORY_RUN_KEYS = ("workload", "request_rate", "allocator")
# Held memory: every category but free (docs/metrics.md, the words); token states first.
HELD_COLUMNS = ("token_states_gb", "reservation_gb", "internal_frag_gb", "external_frag_gb")


def envelope_rows(
    x: npt.ArrayLike, ys: Sequence[npt.ArrayLike], num_buckets: int
) -> npt.NDArray[np.intp]:
    """Positions (ascending) of the rows to draw of the lines ``ys`` over the finite ``x``.

    ``x``'s range is cut into ``num_buckets`` buckets of equal width; in each, the first row
    holding each line's minimum and the first holding its maximum are kept (NaN values aside),
    and so are the first and the last row. A line of n rows keeps at most
    ``2 * len(ys) * num_buckets + 2`` of them. O(n): no sort, so x need not be ordered.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets={num_buckets} is invalid; expected an integer >= 1")
    x_values = np.asarray(x, dtype=np.float64)
    num_rows = len(x_values)
    if num_rows <= 2 * len(ys) * num_buckets + 2:
        return np.arange(num_rows)
    low, high = x_values.min(), x_values.max()
    scale = num_buckets / (high - low) if high > low else 0.0
    buckets = np.minimum(((x_values - low) * scale).astype(np.intp), num_buckets - 1)
    kept = [np.array([0, num_rows - 1])]
    for y in ys:
        values = np.asarray(y, dtype=np.float64)
        for extreme, start in ((np.fmin, np.inf), (np.fmax, -np.inf)):
            per_bucket = np.full(num_buckets, start)
            extreme.at(per_bucket, buckets, values)
            kept.append(_first_row_per_bucket(np.flatnonzero(values == per_bucket[buckets]),
                                              buckets, num_rows))  # fmt: skip
    return np.unique(np.concatenate(kept))


def _first_row_per_bucket(
    rows: npt.NDArray[np.intp], buckets: npt.NDArray[np.intp], num_rows: int
) -> npt.NDArray[np.intp]:
    """The first of ``rows`` in each bucket that has one."""
    first = np.full(int(buckets.max()) + 1, num_rows)
    np.minimum.at(first, buckets[rows], rows)
    return first[first < num_rows]


def held_gb(steps: pd.DataFrame) -> pd.Series:
    """The KV memory held (not free) per step (GB): token states, reservation, internal and
    external fragmentation. A flat line at the pool is an allocator out of memory, whether
    requests hold it or fragmentation strands it."""
    tokens, reservation, internal_frag, external_frag = HELD_COLUMNS
    return steps[tokens] + steps[reservation] + steps[internal_frag] + steps[external_frag]


def memory_chart_rows(steps: pd.DataFrame, num_buckets: int = CHART_BUCKETS) -> pd.DataFrame:
    """The rows and columns of ``steps`` the memory-over-time chart draws: per run
    (``MEMORY_RUN_KEYS``), the envelope of its token-state and held-memory lines over
    ``num_buckets`` buckets of its time; x, the held columns and the run keys.

    Thinning rows already thinned with as many buckets keeps them all (a run's first and last
    rows fix its buckets), so the tasks may thin each run once and the chart again.
    """
    keys = [key for key in MEMORY_RUN_KEYS if key in steps.columns]
    columns = [MEMORY_X, *HELD_COLUMNS, *keys]
    if steps.empty or not keys:
        return steps[columns]
    runs = steps.groupby(keys, sort=False, dropna=False).indices.values()
    return steps[columns].iloc[_envelope_positions(steps, runs, num_buckets)]


def run_memory_chart_rows(
    steps: pd.DataFrame, labels: Mapping[str, object], num_buckets: int = CHART_BUCKETS
) -> pd.DataFrame:
    """``memory_chart_rows`` of one run's steps, not yet labelled: thinned as that run, then
    given its ``labels`` (the run keys among them), so that only the kept rows carry them."""
    columns = [MEMORY_X, *HELD_COLUMNS]
    run_keys = {key: labels[key] for key in MEMORY_RUN_KEYS if key in labels}
    if steps.empty:
        return steps[columns].assign(**run_keys)
    positions = _envelope_positions(steps, [np.arange(len(steps))], num_buckets)
    return steps[columns].iloc[positions].assign(**run_keys)


def _envelope_positions(
    steps: pd.DataFrame, runs: Iterable[npt.NDArray[np.intp]], num_buckets: int
) -> npt.NDArray[np.intp]:
    """The positions of ``steps`` kept by ``envelope_rows`` in each run (its row positions)."""
    x_values = steps[MEMORY_X].to_numpy()
    tokens = steps[HELD_COLUMNS[0]].to_numpy()
    held = held_gb(steps).to_numpy()
    positions = [
        rows[envelope_rows(x_values[rows], (tokens[rows], held[rows]), num_buckets)]
        for rows in runs
    ]
    return np.sort(np.concatenate(positions))
