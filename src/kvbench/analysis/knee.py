"""The knee of a latency-vs-rate curve: the highest request rate a deployment sustains.

The vLLM paper reads a system's throughput off its Fig. 12 as the rate where normalized latency
"explodes". kvbench makes that reading mechanical: given a latency bound, the knee is the rate
where the curve first crosses the bound, walking up from the lowest rate, interpolated between
the last sampled rate under the bound and the first one over it (linearly in the logarithm of
the latency, because latency past saturation grows geometrically with the rate on a finite
trace). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Knee:
    """Where a latency curve crosses its bound.

    ``rate`` is the knee in req/s; ``censored`` is True when the curve never crossed the bound
    in the sampled range (``rate`` is then the highest sampled rate, a lower bound on the knee);
    ``rate`` is NaN when even the lowest sampled rate is over the bound.
    """

    rate: float
    censored: bool


def latency_bound(
    unloaded_latency: float, multiple: float, absolute: float | None = None
) -> float:
    """The latency bound (s/token): ``absolute`` when given, else ``multiple`` x unloaded."""
    if absolute is not None:
        return absolute
    return multiple * unloaded_latency


def find_knee(rates: Sequence[float], latencies: Sequence[float], bound: float) -> Knee:
    """The highest rate whose normalized latency stays under ``bound`` (see the module docstring).

    ``rates`` and ``latencies`` are one allocator's curve, in any order; NaN latencies (no request
    finished) count as over the bound.
    """
    if len(rates) != len(latencies):
        raise ValueError(f"{len(rates)} rates but {len(latencies)} latencies")
    if not rates:
        return Knee(rate=math.nan, censored=False)
    points = sorted(zip(rates, latencies, strict=True))
    previous: tuple[float, float] | None = None
    for rate, latency in points:
        if math.isnan(latency) or latency > bound:
            if previous is None:
                return Knee(rate=math.nan, censored=False)
            return Knee(rate=_crossing(previous, (rate, latency), bound), censored=False)
        previous = (rate, latency)
    return Knee(rate=points[-1][0], censored=True)


def _crossing(under: tuple[float, float], over: tuple[float, float], bound: float) -> float:
    """The rate between two samples where log-latency, linear in rate, reaches log(bound)."""
    (rate_low, latency_low), (rate_high, latency_high) = under, over
    if math.isnan(latency_high) or latency_low <= 0:
        return rate_low  # nothing to interpolate towards: keep the last rate known to be under
    fraction = math.log(bound / latency_low) / math.log(latency_high / latency_low)
    return rate_low + fraction * (rate_high - rate_low)
