"""Arrival times (seconds) for a workload: Poisson, gamma, all-at-once, or a trace's own.

Generated processes start at t = 0 with the first request and add one inter-arrival gap after
each request, as vLLM's benchmark_serving does (it sends a request, then sleeps the gap).
"""

from __future__ import annotations

import math

import numpy as np

from kvbench.workloads.seeding import SeedLike, as_generator


def _from_gaps(gaps_s: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(gaps_s[:-1]))) if gaps_s.size else gaps_s


def burst_arrivals(num_requests: int) -> np.ndarray:
    """All requests at t = 0 (vLLM's ``--request-rate inf``)."""
    return np.zeros(num_requests, dtype="float64")


def poisson_arrivals(num_requests: int, request_rate: float, seed: SeedLike = 0) -> np.ndarray:
    """Arrivals of a Poisson process of ``request_rate`` requests/s (exponential gaps)."""
    if math.isinf(request_rate):
        return burst_arrivals(num_requests)
    _check_rate(request_rate)
    gaps_s = as_generator(seed).exponential(1.0 / request_rate, size=num_requests)
    return _from_gaps(gaps_s)


def gamma_arrivals(
    num_requests: int, request_rate: float, cv: float, seed: SeedLike = 0
) -> np.ndarray:
    """Arrivals with gamma-distributed gaps of mean 1/request_rate and coefficient of variation
    ``cv`` (cv = 1 is Poisson; cv > 1 is burstier). vLLM's ``--burstiness`` is 1 / cv**2."""
    if math.isinf(request_rate):
        return burst_arrivals(num_requests)
    _check_rate(request_rate)
    if not cv > 0 or math.isinf(cv):
        raise ValueError(f"cv={cv} is invalid; expected a finite coefficient of variation > 0")
    shape = 1.0 / cv**2
    gaps_s = as_generator(seed).gamma(shape, 1.0 / (request_rate * shape), size=num_requests)
    return _from_gaps(gaps_s)


def scale_trace_arrivals(
    arrival_s: np.ndarray, time_scale: float = 1.0, request_rate: float | None = None
) -> np.ndarray:
    """A trace's own timestamps, shifted to start at 0 and stretched in time.

    ``time_scale`` multiplies every time (0.5 replays the trace twice as fast). When
    ``request_rate`` is given instead, the times are scaled so that the mean rate
    (requests / span) equals it; the shape of the arrival process is kept either way.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale={time_scale} is invalid; expected a factor > 0")
    times_s = np.asarray(arrival_s, dtype="float64")
    if np.isnan(times_s).any():
        raise ValueError("the trace has no timestamps (arrival_s is NaN); expected arrival "
                         "poisson, gamma or burst for it")
    shifted_s = times_s - times_s.min() if times_s.size else times_s
    if request_rate:
        _check_rate(request_rate)
        span_s = float(shifted_s.max()) if shifted_s.size else 0.0
        if span_s <= 0:
            raise ValueError("the trace's timestamps span 0 s; a request_rate cannot rescale them")
        return shifted_s * (len(shifted_s) / span_s) / request_rate
    return shifted_s * time_scale


def _check_rate(request_rate: float) -> None:
    if not request_rate > 0:
        raise ValueError(f"request_rate={request_rate} is invalid; expected requests/s > 0")
