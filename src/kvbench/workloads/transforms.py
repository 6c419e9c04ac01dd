"""Pure functions of trace DataFrames: the transformations a workload goes through (vLLM's
filter, clipping, sampling, renumbering) and the summary statistics that describe one (what the
workload cards and the fidelity tests compare).

None of them reads or writes files; each transformation returns a new DataFrame and leaves its
input untouched (``attrs`` such as ``hash_block_tokens`` are carried over).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.workloads.generators import SeedLike, as_generator
from kvbench.workloads.schema import (
    ARRIVAL_S,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PROMPT_TOKENS,
    REQUEST_ID,
    REQUESTED_OUTPUT_TOKENS,
)

# vLLM's benchmarks/benchmark_serving.py (sample_sharegpt_requests) prunes with these bounds.
VLLM_MIN_PROMPT_TOKENS = 4
VLLM_MIN_OUTPUT_TOKENS = 4
VLLM_MAX_PROMPT_TOKENS = 1024
VLLM_MAX_TOTAL_TOKENS = 2048
# The length percentiles the statistics report (trace_statistics, the workload cards).
PERCENTILES = (50, 90, 99)
LENGTH_STATISTICS = ("mean", *(f"p{p}" for p in PERCENTILES), "max")

# --- Transformations ---


def _with_attrs(result: pd.DataFrame, source: pd.DataFrame) -> pd.DataFrame:
    result.attrs = dict(source.attrs)
    return result


def filter_vllm(
    df: pd.DataFrame,
    min_prompt_tokens: int = VLLM_MIN_PROMPT_TOKENS,
    min_output_tokens: int = VLLM_MIN_OUTPUT_TOKENS,
    max_prompt_tokens: int = VLLM_MAX_PROMPT_TOKENS,
    max_total_tokens: int = VLLM_MAX_TOTAL_TOKENS,
) -> pd.DataFrame:
    """Rows vLLM's serving benchmark keeps: prompt and output at least 4 tokens, prompt at most
    1024, prompt + output at most 2048 (each bound overridable). Row order is kept."""
    prompt_tokens = df[PROMPT_TOKENS]
    output_tokens = df[OUTPUT_TOKENS]
    keep = (
        (prompt_tokens >= min_prompt_tokens)
        & (output_tokens >= min_output_tokens)
        & (prompt_tokens <= max_prompt_tokens)
        & (prompt_tokens + output_tokens <= max_total_tokens)
    )
    return _with_attrs(df.loc[keep].reset_index(drop=True), df)


def clip_to_max_len(df: pd.DataFrame, max_model_len: int) -> pd.DataFrame:
    """Clip outputs to a model's context of ``max_model_len`` tokens; drop no row.

    A request whose prompt leaves room in the context has its output clipped so that prompt +
    output <= max_model_len (a server stops it at the context's end). ``requested_output_tokens``
    keeps every row's input output length. A prompt that alone reaches ``max_model_len`` keeps
    its lengths: the engine rejects it (``prompt_exceeds_max_model_len``), so it is still counted.
    """
    if max_model_len < 1:
        raise ValueError(f"max_model_len={max_model_len} is invalid; expected an integer >= 1")
    clipped = df.copy()
    prompt_tokens = clipped[PROMPT_TOKENS].to_numpy()
    output_tokens = clipped[OUTPUT_TOKENS].to_numpy()
    if REQUESTED_OUTPUT_TOKENS not in clipped.columns:
        clipped[REQUESTED_OUTPUT_TOKENS] = output_tokens
    room_tokens = max_model_len - prompt_tokens
    fits = room_tokens > 0
    clipped[OUTPUT_TOKENS] = np.where(fits, np.minimum(output_tokens, room_tokens), output_tokens)
    return _with_attrs(clipped, df)


def sample_requests(
    df: pd.DataFrame, num_requests: int, seed: SeedLike = 0, replace: bool | None = None
) -> pd.DataFrame:
    """``num_requests`` rows drawn at random (seeded), in the order drawn.

    ``replace`` None draws without replacement when the frame has enough rows and with
    replacement otherwise; duplicated rows keep their ``request_id`` (renumber afterwards).
    """
    if num_requests < 1:
        raise ValueError(f"num_requests={num_requests} is invalid; expected an integer >= 1")
    if df.empty:
        raise ValueError("sample_requests: the frame has no rows to sample from")
    with_replacement = num_requests > len(df) if replace is None else replace
    if not with_replacement and num_requests > len(df):
        raise ValueError(f"num_requests={num_requests} exceeds the {len(df)} rows; expected "
                         f"replace=True or at most {len(df)}")
    rng = as_generator(seed)
    positions = rng.choice(len(df), size=num_requests, replace=with_replacement)
    return _with_attrs(df.iloc[positions].reset_index(drop=True), df)


def conversation_prefixes(df: pd.DataFrame) -> pd.DataFrame:
    """Name the history that consecutive turns of a conversation share, for a trace whose rows
    are the turns of conversations in order, each prompt the whole history so far (ShareGPT
    multi-turn as Sarathi-Serve processed it: no conversation ids).

    A row whose prompt holds at least the previous row's prompt and output continues that row's
    conversation; any other row starts one. Every row gets ``prefix_group`` = its conversation's
    index and ``prefix_tokens`` = its prompt, so a turn's prompt agrees with the next turn's on
    every position it has (the output between them is not named: kvbench caches prompts only).
    """
    prompt_tokens = df[PROMPT_TOKENS].to_numpy()
    output_tokens = df[OUTPUT_TOKENS].to_numpy()
    continues = np.zeros(len(df), dtype=bool)
    continues[1:] = prompt_tokens[1:] >= prompt_tokens[:-1] + output_tokens[:-1]
    result = df.copy()
    result[PREFIX_GROUP] = np.cumsum(~continues) - 1
    result[PREFIX_TOKENS] = prompt_tokens.astype("int64")
    return _with_attrs(result, df)


def sort_and_renumber(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in arrival order (stable), with ``request_id`` 0..N-1 in that order."""
    ordered = df.sort_values(ARRIVAL_S, kind="stable").reset_index(drop=True)
    ordered[REQUEST_ID] = np.arange(len(ordered), dtype="int64")
    return _with_attrs(ordered, df)


# --- Statistics ---


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
