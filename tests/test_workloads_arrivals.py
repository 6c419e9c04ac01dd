"""Arrival processes: rate, burstiness, determinism, and replaying a trace's own timestamps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.workloads import (
    burst_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    scale_trace_arrivals,
)

NUM_LARGE = 200_000


def _gaps(arrival_s: np.ndarray) -> np.ndarray:
    return np.diff(arrival_s)


def test_poisson_mean_gap_is_one_over_rate():
    arrival_s = poisson_arrivals(NUM_LARGE, request_rate=2.0, seed=0)
    gaps = _gaps(arrival_s)
    assert arrival_s[0] == 0.0
    assert gaps.mean() == pytest.approx(0.5, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 1.09, 3.0])
def test_gamma_has_the_requested_rate_and_cv(cv):
    gaps = _gaps(gamma_arrivals(NUM_LARGE, request_rate=5.53, cv=cv, seed=1))
    assert 1 / gaps.mean() == pytest.approx(5.53, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.03)


def test_arrivals_are_seeded():
    assert np.array_equal(poisson_arrivals(100, 3.0, seed=7), poisson_arrivals(100, 3.0, seed=7))
    assert not np.array_equal(poisson_arrivals(100, 3.0, seed=7),
                              poisson_arrivals(100, 3.0, seed=8))
    assert np.array_equal(gamma_arrivals(50, 3.0, 2.0, seed=7), gamma_arrivals(50, 3.0, 2.0, 7))


def test_infinite_rate_and_burst_put_everything_at_zero():
    assert not poisson_arrivals(5, float("inf")).any()
    assert not gamma_arrivals(5, float("inf"), 2.0).any()
    assert not burst_arrivals(5).any()


@pytest.mark.parametrize("bad_rate", [0.0, -1.0])
def test_rates_must_be_positive(bad_rate):
    with pytest.raises(ValueError, match=f"request_rate={bad_rate} is invalid"):
        poisson_arrivals(5, bad_rate)


def test_gamma_cv_must_be_positive():
    with pytest.raises(ValueError, match="cv=0 is invalid"):
        gamma_arrivals(5, 1.0, cv=0)


def test_trace_arrivals_shift_and_time_scale():
    times = np.array([10.0, 11.0, 14.0])
    assert scale_trace_arrivals(times).tolist() == [0.0, 1.0, 4.0]
    assert scale_trace_arrivals(times, time_scale=0.5).tolist() == [0.0, 0.5, 2.0]


def test_trace_arrivals_rescaled_to_a_rate():
    times = np.array([0.0, 1.0, 4.0, 8.0])  # 4 requests over 8 s: 0.5 req/s
    rescaled = scale_trace_arrivals(times, request_rate=2.0)
    assert rescaled.tolist() == [0.0, 0.25, 1.0, 2.0]
    assert len(rescaled) / rescaled[-1] == pytest.approx(2.0)


def test_trace_without_timestamps_cannot_be_replayed():
    with pytest.raises(ValueError, match="no timestamps"):
        scale_trace_arrivals(np.array([np.nan, np.nan]))


@given(st.integers(0, 300), st.floats(0.01, 1000), st.floats(0.1, 5), st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_generated_arrivals_start_at_zero_and_never_go_back(num, rate, cv, seed):
    for arrival_s in (poisson_arrivals(num, rate, seed), gamma_arrivals(num, rate, cv, seed)):
        assert len(arrival_s) == num
        assert (np.diff(arrival_s) >= 0).all()
        if num:
            assert arrival_s[0] == 0.0
