"""Summary statistics of a trace (what the workload cards and the fidelity tests compare)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.workloads.columns import ARRIVAL_S, OUTPUT_TOKENS, PREFIX_BLOCK_HASHES, PROMPT_TOKENS

PERCENTILES = (50, 90, 99)
LENGTH_STATISTICS = ("mean", *(f"p{p}" for p in PERCENTILES), "max")


def length_statistics(tokens: np.ndarray | pd.Series) -> dict[str, float]:
    """mean, p50, p90, p99 (numpy's linear interpolation) and max of token counts."""
    values = np.asarray(tokens, dtype="float64")
    statistics = {"mean": float(values.mean())}
    for percentile in PERCENTILES:
        statistics[f"p{percentile}"] = float(np.percentile(values, percentile))
    statistics["max"] = float(values.max())
    return statistics


def arrival_statistics(arrival_s: np.ndarray | pd.Series) -> dict[str, float]:
    """Span (s), mean rate (requests / span) and coefficient of variation of the gaps."""
    times_s = np.sort(np.asarray(arrival_s, dtype="float64"))
    span_s = float(times_s[-1] - times_s[0])
    gaps_s = np.diff(times_s)
    return {
        "span_s": span_s,
        "request_rate": len(times_s) / span_s if span_s > 0 else float("inf"),
        "interarrival_cv": float(gaps_s.std() / gaps_s.mean()) if gaps_s.mean() > 0 else 0.0,
    }


def repeated_block_fraction(df: pd.DataFrame) -> float:
    """Share of prompt blocks whose hash already appeared in an earlier request (or earlier in
    the same prompt), in row order: the blocks a perfect prefix cache would not recompute."""
    seen: set[int] = set()
    num_blocks = num_repeated = 0
    for hashes in df[PREFIX_BLOCK_HASHES]:
        for block_hash in hashes:
            num_blocks += 1
            num_repeated += block_hash in seen
            seen.add(block_hash)
    return num_repeated / num_blocks if num_blocks else 0.0


def trace_statistics(df: pd.DataFrame) -> dict[str, float]:
    """Rows, prompt_*/output_* length statistics, and arrival statistics when timestamps exist."""
    statistics: dict[str, float] = {"rows": float(len(df))}
    for prefix, column in (("prompt", PROMPT_TOKENS), ("output", OUTPUT_TOKENS)):
        for key, value in length_statistics(df[column]).items():
            statistics[f"{prefix}_{key}"] = value
    if not df[ARRIVAL_S].isna().all():
        statistics.update(arrival_statistics(df[ARRIVAL_S]))
    return statistics
