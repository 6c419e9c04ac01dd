"""Fleet sizing: the replicas, GPUs and dollars per hour each allocator needs for a target rate.

A replica is one deployment (``num_gpus`` tensor-parallel GPUs). It serves at most its knee rate
under the latency bound (``kvbench.analysis.curves``), so a fleet serving ``target`` req/s needs
``ceil(target / knee)`` replicas, with the traffic split evenly (a Poisson stream split at random
is Poisson at ``target / replicas`` per replica). Memory held vs used comes from runs at that
per-replica operating rate. Column definitions: ``docs/metrics.md``. Pure: pandas in and out.
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.curves import curve_keys


def replicas_needed(target_rate: float, knee_rate: float) -> float:
    """Replicas (a whole number, as float) serving ``target_rate`` at ``knee_rate`` each; NaN if
    a replica cannot meet the bound at any rate (unknown or zero knee)."""
    if math.isnan(knee_rate) or knee_rate <= 0:
        return math.nan
    # A float knee such as 2.0000000001 for a target of 4 must not turn 2 replicas into 3.
    return float(math.ceil(round(target_rate / knee_rate, 9)))


def fleet_frame(
    knees: pd.DataFrame,
    target_rate: float,
    price_per_gpu_hour: float,
    replicas: dict[int, float] | None = None,
) -> pd.DataFrame:
    """One row per curve and allocator: replicas, GPUs and cost to serve ``target_rate``.

    ``knees`` is ``knees_frame``'s output (with ``num_gpus``). ``replicas_from_knee`` is
    ``replicas_needed(target, knee)``; ``replicas`` (position of the row in ``knees`` -> count)
    overrides it where a run at the operating rate showed more are needed. A censored knee (the
    curve never crossed the bound) makes the count an upper bound (``replicas_upper_bound``).
    """
    from_knee = [replicas_needed(target_rate, knee) for knee in knees["knee_rate"]]
    chosen = [(replicas or {}).get(position, count) for position, count in enumerate(from_knee)]
    fleet = knees.assign(
        target_request_rate=target_rate,
        replicas_from_knee=from_knee,
        replicas=chosen,
        replicas_upper_bound=knees["knee_censored"].astype(bool),
    )
    fleet["gpus"] = fleet["replicas"] * fleet["num_gpus"]
    fleet["price_per_gpu_hour"] = price_per_gpu_hour
    fleet["cost_per_hour"] = fleet["gpus"] * price_per_gpu_hour
    fleet["operating_rate_per_replica"] = target_rate / fleet["replicas"]
    return fleet


def with_fleet_memory(fleet: pd.DataFrame, operating: pd.DataFrame) -> pd.DataFrame:
    """``fleet`` with the KV memory (GB, whole fleet) measured at each allocator's operating rate.

    ``operating`` is a summary table of runs at ``operating_rate_per_replica`` (one per curve and
    allocator). Held = the pool less its free part (token states, reservation, internal and
    external fragmentation), used = token states, both time-weighted, times the replicas.
    """
    keys = [key for key in curve_keys(operating) if key in fleet.columns] + ["allocator"]
    per_replica = operating[keys].assign(
        kv_pool_gb_fleet=operating["kv_pool_gb"],
        kv_held_gb=operating["kv_held_gb"],
        kv_used_gb=operating["token_states_gb"],
        operating_latency_s_per_token=operating["normalized_latency_s_per_token"],
    )
    merged = fleet.merge(per_replica, on=keys, how="left")
    for column in ("kv_pool_gb_fleet", "kv_held_gb", "kv_used_gb"):
        merged[column] = merged[column] * merged["replicas"]
    merged["kv_held_over_used"] = merged["kv_held_gb"] / merged["kv_used_gb"]
    return merged
