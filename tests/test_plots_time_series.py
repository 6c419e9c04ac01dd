"""Long time series drawn as their per-pixel envelope: every bucket's minimum and maximum, the
first and last points, and a bounded number of points however long the run."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvbench.plots import run_charts
from kvbench.plots.time_series import (
    CHART_BUCKETS,
    envelope_rows,
    held_gb,
    memory_chart_rows,
)


def _buckets(x, num_buckets):
    low, high = x.min(), x.max()
    return np.minimum(((x - low) * (num_buckets / (high - low))).astype(np.int64), num_buckets - 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ordered", [True, False])
def test_the_envelope_keeps_every_buckets_min_and_max_and_both_ends(seed, ordered):
    rng = np.random.default_rng(seed)
    num_rows, num_buckets = 50_000, 300
    x = np.cumsum(rng.exponential(1.0, num_rows))  # uneven steps, as iteration times are
    if not ordered:
        x = rng.permutation(x)
    lines = [np.cumsum(rng.normal(size=num_rows)), rng.integers(0, 50, num_rows).astype(float)]
    lines[0][12_345] = 1e6  # a one-step peak that striding would miss
    lines[1][rng.integers(0, num_rows, 100)] = np.nan  # no value: the bucket's others count
    kept = envelope_rows(x, lines, num_buckets)
    assert np.all(np.diff(kept) > 0)  # row order, each row once
    assert kept[0] == 0 and kept[-1] == num_rows - 1
    assert 12_345 in kept
    assert len(kept) <= 2 * len(lines) * num_buckets + 2
    buckets = _buckets(x, num_buckets)
    for y in lines:
        full = pd.Series(y).groupby(buckets)
        shown = pd.Series(y[kept]).groupby(buckets[kept])
        pd.testing.assert_series_equal(shown.min(), full.min())
        pd.testing.assert_series_equal(shown.max(), full.max())


def test_a_short_series_is_kept_whole_and_a_flat_x_still_works():
    assert envelope_rows(np.arange(10.0), [np.zeros(10)], 100).tolist() == list(range(10))
    kept = envelope_rows(np.zeros(1000), [np.arange(1000.0)], 2)  # every x equal: one bucket
    assert kept.tolist() == [0, 999]
    with pytest.raises(ValueError, match="num_buckets=0"):
        envelope_rows(np.arange(10.0), [np.zeros(10)], 0)


def _steps(num_steps, allocators=("paged",), rates=(2.0,)):
    rng = np.random.default_rng(0)
    frames = []
    for rate in rates:
        for allocator in allocators:
            frames.append(pd.DataFrame({
                "time_s": np.cumsum(rng.exponential(0.02, num_steps)),
                "token_states_gb": rng.uniform(0, 40, num_steps),
                "reservation_gb": rng.uniform(0, 5, num_steps),
                "internal_frag_gb": rng.uniform(0, 1, num_steps),
                "external_frag_gb": rng.uniform(0, 2, num_steps),
                "workload": "azure_conv", "request_rate": rate, "allocator": allocator,
            }))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def test_memory_chart_rows_thin_each_run_on_both_lines_and_keep_thinned_rows_whole():
    steps = _steps(40_000, allocators=("paged", "naive_max"))
    rows = memory_chart_rows(steps)
    for _, run in rows.groupby("allocator"):
        assert len(run) <= 4 * CHART_BUCKETS + 2
    full = steps.groupby("allocator")
    assert rows.groupby("allocator")["token_states_gb"].max().equals(full["token_states_gb"].max())
    held = held_gb(steps).groupby(steps["allocator"]).max()
    assert held_gb(rows).groupby(rows["allocator"]).max().equals(held)
    assert memory_chart_rows(rows).index.equals(rows.index)  # thinning twice changes nothing


def test_held_memory_is_every_category_but_free():
    # A buddy allocator out of memory: 2 GB of tokens, 1 reserved, 0.5 past the requests' ends,
    # 4 stranded between extents, 0.5 free. Held is the 7.5 GB no waiting request can get.
    step = pd.DataFrame({"token_states_gb": [2.0], "reservation_gb": [1.0],
                         "internal_frag_gb": [0.5], "external_frag_gb": [4.0],
                         "free_gb": [0.5]})  # fmt: skip
    assert held_gb(step).tolist() == [7.5]


def test_a_500k_step_run_is_drawn_with_a_few_thousand_points(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(run_charts, "save_figure", lambda fig, *_: figures.append(fig))
    run_charts.plot_memory_over_time(_steps(500_000, rates=(2.0, 5.0)), tmp_path)
    (figure,) = figures
    lines = [line for ax in figure.axes for line in ax.get_lines()]
    plt.close(figure)
    assert len(lines) == 4  # tokens and held, per rate
    max_points = 4 * CHART_BUCKETS + 2
    assert all(len(line.get_xdata()) <= max_points for line in lines)
    assert min(len(line.get_xdata()) for line in lines) > CHART_BUCKETS  # still the shape
