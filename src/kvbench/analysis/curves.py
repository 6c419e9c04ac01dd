"""Rate sweeps as throughput: each allocator's knee, and the knee ratios between allocators.

Works on summary tables (one row per workload x rate x allocator x setting, as runs write them,
one run or many aggregated): rows that differ only in ``request_rate`` form one curve. Every
allocator of a group (same experiment, scheduler, workload, deployment and pool, block size,
preemption mode, KV dtype, queue policy, CPU tier, samples and beams) is held to the same latency
bound, so knee ratios compare throughput at equal latency. Column
definitions: ``docs/metrics.md``. Pure: pandas in, pandas out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.analysis.knee import find_knee, latency_bound

LATENCY = "normalized_latency_s_per_token"
# A curve's identity, less its allocator: every label a run sets for all its allocators alike
# (a sweep of any of them beside the rates is several curves); older tables without a column
# are grouped without it.
CURVE_KEYS = (
    "experiment", "scheduler", "workload", "model", "hardware", "num_gpus", "num_kv_slots",
    "block_size", "preemption", "kv_dtype", "policy", "async_scheduling", "cpu_cache_gib",
    "cpu_eviction_policy", "cpu_store_threshold", "cpu_max_tracker_size",
    "cpu_offload_prompt_only", "cpu_blocks_per_chunk", "n", "beam_width",
)  # fmt: skip
REFERENCE_ALLOCATOR = "paged"
MIN_RATES = 2


def curve_keys(summary: pd.DataFrame) -> list[str]:
    """The columns of ``CURVE_KEYS`` that ``summary`` has."""
    return [key for key in CURVE_KEYS if key in summary.columns]


def knees_frame(
    summary: pd.DataFrame, latency_multiple: float, max_latency_s_per_token: float | None = None
) -> pd.DataFrame:
    """One row per curve (two rates or more) and allocator: its knee (req/s) under a common bound.

    The bound is ``max_latency_s_per_token`` when given, else ``latency_multiple`` times the
    group's unloaded latency: the lowest normalized latency any of its allocators reached at any
    rate (the sweep's lowest rate should be light load; then all allocators agree on it).
    """
    keys = curve_keys(summary)
    rows = []
    for group_values, group in summary.groupby(keys, sort=False, dropna=False):
        unloaded = float(group[LATENCY].min())
        bound = latency_bound(unloaded, latency_multiple, max_latency_s_per_token)
        labels = dict(zip(keys, group_values, strict=True))
        for allocator, curve in group.groupby("allocator", sort=False):
            if curve["request_rate"].nunique() < MIN_RATES:
                continue  # one rate is a point, not a curve: it has no knee
            knee = find_knee(list(curve["request_rate"]), list(curve[LATENCY]), bound)
            rows.append({
                **labels,
                "allocator": allocator,
                "num_rates": len(curve),
                "min_rate": float(curve["request_rate"].min()),
                "max_rate": float(curve["request_rate"].max()),
                "unloaded_latency_s_per_token": unloaded,
                "latency_bound_s_per_token": bound,
                "knee_rate": knee.rate,
                "knee_censored": knee.censored,
            })  # fmt: skip
    return pd.DataFrame(rows)


def knee_ratios(knees: pd.DataFrame, reference: str = REFERENCE_ALLOCATOR) -> pd.DataFrame:
    """``knees`` with ``knee_ratio``: the reference allocator's knee over this row's, per curve.

    A ratio of 2 means the reference (paged) sustains twice this allocator's request rate at the
    same latency bound. NaN where either knee is unknown. ``knee_ratio_bound`` says what a
    censored knee (beyond the sampled rates) makes of the ratio: "exact"; "lower" (the
    reference's knee is censored: the ratio is at least this); "upper" (this row's is: at most
    this); "unknown" (both are: the ratio says nothing); "" where the ratio is NaN.
    """
    if knees.empty:
        return knees
    keys = curve_keys(knees)
    reference_knees = knees.loc[
        knees["allocator"] == reference, [*keys, "knee_rate", "knee_censored"]
    ].rename(columns={"knee_rate": "_ref_rate", "knee_censored": "_ref_censored"})
    merged = knees.merge(reference_knees, on=keys, how="left")
    ratio = merged["_ref_rate"] / merged["knee_rate"].where(merged["knee_rate"] > 0)
    other = merged["allocator"] != reference  # the reference's own ratio is exactly 1
    reference_censored = merged["_ref_censored"].fillna(False).astype(bool) & other
    own_censored = merged["knee_censored"].astype(bool) & other
    bound = np.select(
        [ratio.isna(), reference_censored & own_censored, reference_censored, own_censored],
        ["", "unknown", "lower", "upper"],
        default="exact",
    )
    return merged.drop(columns=["_ref_rate", "_ref_censored"]).assign(
        knee_ratio=ratio, knee_ratio_bound=bound
    )


def knee_sensitivity(
    summary: pd.DataFrame, multiples: tuple[float, ...] = (2.0, 4.0, 10.0)
) -> pd.DataFrame:
    """Knees and ratios under several latency multiples: how much the choice of bound matters."""
    frames = [
        knee_ratios(knees_frame(summary, multiple)).assign(latency_multiple=multiple)
        for multiple in multiples
    ]
    return pd.concat(frames, ignore_index=True)
