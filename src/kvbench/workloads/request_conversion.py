"""Turn a workload DataFrame into the frozen Request records the engine consumes."""

from __future__ import annotations

import math

import pandas as pd

from kvbench.core.request import Request
from kvbench.workloads.columns import (
    ARRIVAL_S,
    BEAM_WIDTH,
    HASH_BLOCK_TOKENS_ATTR,
    NUM_SAMPLES,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PROMPT_TOKENS,
    REQUEST_ID,
)


def _optional_column(df: pd.DataFrame, name: str, default: object) -> list:
    return df[name].tolist() if name in df.columns else [default] * len(df)


def to_requests(df: pd.DataFrame) -> list[Request]:
    """One :class:`~kvbench.core.request.Request` per row, in row order.

    ``prefix_group`` (<NA> → None) and ``prefix_tokens`` are mapped when present;
    ``prefix_block_hashes`` becomes a tuple, with ``hash_block_tokens`` from
    ``df.attrs["hash_block_tokens"]``.

    Raises:
        ValueError: a row has no arrival time (NaN): give the workload arrivals first.
    """
    arrivals_s = df[ARRIVAL_S].tolist()
    missing = next((i for i, arrival in enumerate(arrivals_s) if math.isnan(arrival)), None)
    if missing is not None:
        raise ValueError(f"row {missing + 1} has arrival_s NaN; expected arrival times "
                         f"(build_workload assigns them)")
    has_hashes = PREFIX_BLOCK_HASHES in df.columns
    hash_block_tokens = int(df.attrs.get(HASH_BLOCK_TOKENS_ATTR, 0)) if has_hashes else 0
    columns = zip(
        df[REQUEST_ID].tolist(), arrivals_s, df[PROMPT_TOKENS].tolist(),
        df[OUTPUT_TOKENS].tolist(), _optional_column(df, PREFIX_GROUP, None),
        _optional_column(df, PREFIX_TOKENS, 0), _optional_column(df, PREFIX_BLOCK_HASHES, ()),
        _optional_column(df, NUM_SAMPLES, 1), _optional_column(df, BEAM_WIDTH, 1),
        strict=True,
    )
    return [
        Request(
            request_id=int(request_id),
            arrival_s=float(arrival_s),
            prompt_tokens=int(prompt_tokens),
            output_tokens=int(output_tokens),
            prefix_group=None if pd.isna(group) else int(group),
            prefix_tokens=int(prefix_tokens),
            prefix_block_hashes=tuple(int(block) for block in hashes),
            hash_block_tokens=hash_block_tokens,
            num_samples=int(num_samples),
            beam_width=int(beam_width),
        )
        for request_id, arrival_s, prompt_tokens, output_tokens, group, prefix_tokens, hashes,
        num_samples, beam_width
        in columns
    ]
