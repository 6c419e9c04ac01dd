"""The knee of a latency-vs-rate curve: interpolation, censoring, and its properties."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.analysis.knee import Knee, find_knee, latency_bound


def test_knee_interpolates_in_log_latency_between_the_samples_around_the_bound():
    # 0.1 -> 1.0 s/token between 2 and 3 req/s; the bound 0.316 is halfway in log: 2.5 req/s.
    knee = find_knee([1, 2, 3, 4], [0.05, 0.1, 1.0, 5.0], bound=math.sqrt(0.1))
    assert knee.rate == pytest.approx(2.5)
    assert not knee.censored


def test_a_curve_that_never_crosses_is_censored_at_its_highest_rate():
    assert find_knee([1, 2, 3], [0.1, 0.1, 0.2], bound=1.0) == Knee(rate=3, censored=True)


def test_a_curve_over_the_bound_from_the_start_has_no_knee():
    knee = find_knee([1, 2], [2.0, 3.0], bound=1.0)
    assert math.isnan(knee.rate) and not knee.censored


def test_the_first_crossing_counts_even_if_latency_dips_back_later():
    knee = find_knee([1, 2, 3, 4], [0.1, 2.0, 0.1, 0.1], bound=1.0)
    assert 1 < knee.rate < 2


def test_input_order_does_not_matter_and_nan_latency_counts_as_over():
    assert find_knee([3, 1, 2], [1.0, 0.1, 0.2], 0.5) == find_knee([1, 2, 3], [0.1, 0.2, 1.0], 0.5)
    assert find_knee([1, 2], [0.1, math.nan], 0.5) == Knee(rate=1, censored=False)


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="2 rates but 1 latencies"):
        find_knee([1, 2], [0.1], 1.0)


def test_the_absolute_bound_wins_over_the_multiple():
    assert latency_bound(0.02, 4.0) == pytest.approx(0.08)
    assert latency_bound(0.02, 4.0, absolute=0.5) == 0.5


curves = st.lists(
    st.tuples(st.floats(0.1, 100), st.floats(0.001, 10)), min_size=2, max_size=12,
    unique_by=lambda point: point[0],
)  # fmt: skip


@given(curves, st.floats(0.001, 10))
def test_the_knee_lies_between_the_last_rate_under_and_the_first_over(points, bound):
    rates, latencies = zip(*points, strict=True)
    knee = find_knee(rates, latencies, bound)
    ordered = sorted(points)
    if ordered[0][1] > bound:
        assert math.isnan(knee.rate)
        return
    first_over = next((i for i, (_, latency) in enumerate(ordered) if latency > bound), None)
    if first_over is None:
        assert knee == Knee(rate=ordered[-1][0], censored=True)
    else:
        assert ordered[first_over - 1][0] <= knee.rate <= ordered[first_over][0]


@given(curves, st.floats(0.001, 5), st.floats(1.0, 3.0))
def test_a_looser_bound_never_lowers_a_monotone_curve_knee(points, bound, factor):
    ordered = sorted(points)
    rates = [rate for rate, _ in ordered]
    latencies = sorted(latency for _, latency in ordered)  # monotone in rate
    tight = find_knee(rates, latencies, bound)
    loose = find_knee(rates, latencies, bound * factor)
    if not math.isnan(tight.rate):
        assert loose.rate >= tight.rate - 1e-9
