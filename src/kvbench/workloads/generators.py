"""What kvbench generates rather than reads: seeded random streams, arrival processes, and
synthetic workloads.

Arrival processes give each request its arrival time (seconds): Poisson, gamma, all-at-once, or a
trace's own timestamps rescaled. Generated processes start at t = 0 with the first request and add
one inter-arrival gap after each request, as vLLM's benchmark_serving does (it sends a request,
then sleeps the gap). (The engine's queue of requests that have not arrived yet is another thing:
``kvbench.engine.arrival_queue``.)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvbench.workloads.frame import trace_frame
from kvbench.workloads.schema import PREFIX_GROUP, PREFIX_TOKENS

# --- Seeding ---
# One way to turn a seed into a generator, so equal seeds give equal workloads.

SeedLike = int | np.random.Generator


def as_generator(seed: SeedLike) -> np.random.Generator:
    """``seed`` itself when it is a Generator, else a fresh PCG64 generator seeded with it."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def stream(seed: int, purpose: int) -> np.random.Generator:
    """An independent generator per purpose (sampling, arrivals, ...) derived from one seed,
    so that changing how many rows are sampled never shifts the arrival times."""
    return np.random.default_rng([seed, purpose])


# --- Arrival processes ---


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


# --- Synthetic workloads ---


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name}={value} is invalid; expected an integer >= 1")


def fixed_workload(num_requests: int, prompt_tokens: int, output_tokens: int) -> pd.DataFrame:
    """``num_requests`` identical requests (no arrival times yet: arrival_s is NaN)."""
    for name, value in (("num_requests", num_requests), ("prompt_tokens", prompt_tokens),
                        ("output_tokens", output_tokens)):
        _check_positive(name, value)
    return trace_frame(
        prompt_tokens=np.full(num_requests, prompt_tokens, dtype="int64"),
        output_tokens=np.full(num_requests, output_tokens, dtype="int64"),
    )


def system_prompt_workload(
    num_users: int, system_prompt_tokens: int, prompt_tokens: int, output_tokens: int
) -> pd.DataFrame:
    """One request per user, all starting with the same system prompt.

    Each request's prompt is ``system_prompt_tokens`` shared tokens followed by ``prompt_tokens``
    tokens of its own; every row has ``prefix_group`` 0 and ``prefix_tokens`` =
    ``system_prompt_tokens``, so a prefix-sharing allocator can store the system prompt once.
    """
    for name, value in (("num_users", num_users), ("system_prompt_tokens", system_prompt_tokens),
                        ("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        _check_positive(name, value)
    frame = fixed_workload(num_users, system_prompt_tokens + prompt_tokens, output_tokens)
    frame[PREFIX_GROUP] = np.zeros(num_users, dtype="int64")
    frame[PREFIX_TOKENS] = np.full(num_users, system_prompt_tokens, dtype="int64")
    return frame
