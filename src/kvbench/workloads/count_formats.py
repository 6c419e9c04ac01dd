"""Convert traces that already hold token counts (Vidur, Azure, Mooncake, lengths) to kvbench's
canonical columns."""

from __future__ import annotations

import pandas as pd

from kvbench.workloads.columns import (
    ARRIVAL_S,
    MOONCAKE_HASH_BLOCK_TOKENS,
    OUTPUT_TOKENS,
    PREFIX_BLOCK_HASHES,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PROMPT_TOKENS,
    REQUEST_ID,
)
from kvbench.workloads.frames import trace_frame
from kvbench.workloads.locations import RowLocator
from kvbench.workloads.schemas import AZURE, LENGTHS, MOONCAKE, VIDUR
from kvbench.workloads.values import (
    block_hash_lists,
    nullable_counts,
    optional_seconds,
    require_columns,
    seconds,
    seconds_since_first,
    token_counts,
)

_MS_PER_S = 1000.0


def from_vidur(raw: pd.DataFrame, locator: RowLocator) -> pd.DataFrame:
    """Vidur/Sarathi CSV: ``num_prefill_tokens, num_decode_tokens[, arrived_at]`` (seconds)."""
    require_columns(raw, VIDUR, locator)
    return trace_frame(
        prompt_tokens=token_counts(raw, "num_prefill_tokens", locator),
        output_tokens=token_counts(raw, "num_decode_tokens", locator),
        arrival_s=optional_seconds(raw, "arrived_at", locator),
    )


def from_azure(raw: pd.DataFrame, locator: RowLocator) -> pd.DataFrame:
    """Azure LLM inference CSV; arrival_s counts seconds from the earliest TIMESTAMP."""
    require_columns(raw, AZURE, locator)
    return trace_frame(
        prompt_tokens=token_counts(raw, "ContextTokens", locator),
        output_tokens=token_counts(raw, "GeneratedTokens", locator),
        arrival_s=seconds_since_first(raw, "TIMESTAMP", locator),
    )


def from_mooncake(raw: pd.DataFrame, locator: RowLocator) -> pd.DataFrame:
    """Mooncake JSONL: ``timestamp`` (ms), lengths, and ``hash_ids`` of 512-token blocks."""
    require_columns(raw, MOONCAKE, locator)
    has_hashes = "hash_ids" in raw.columns
    return trace_frame(
        prompt_tokens=token_counts(raw, "input_length", locator),
        output_tokens=token_counts(raw, "output_length", locator),
        arrival_s=seconds(raw, "timestamp", locator, unit_s=1 / _MS_PER_S),
        prefix_block_hashes=block_hash_lists(raw, "hash_ids", locator) if has_hashes else None,
        hash_block_tokens=MOONCAKE_HASH_BLOCK_TOKENS,
    )


def from_lengths(
    raw: pd.DataFrame, locator: RowLocator, hash_block_tokens: int = 0
) -> pd.DataFrame:
    """A lengths table: kvbench's own columns (CSV, JSONL or the parquet of ``save_trace``).

    ``prompt_tokens, output_tokens`` are required; ``request_id``, ``arrival_s`` and the prefix
    columns are kept when present, other columns are ignored.
    """
    require_columns(raw, LENGTHS, locator)
    columns = set(raw.columns)
    hashes = PREFIX_BLOCK_HASHES in columns
    frame = trace_frame(
        prompt_tokens=token_counts(raw, PROMPT_TOKENS, locator),
        output_tokens=token_counts(raw, OUTPUT_TOKENS, locator),
        arrival_s=optional_seconds(raw, ARRIVAL_S, locator),
        request_ids=token_counts(raw, REQUEST_ID, locator) if REQUEST_ID in columns else None,
        prefix_block_hashes=block_hash_lists(raw, PREFIX_BLOCK_HASHES, locator) if hashes else None,
        hash_block_tokens=hash_block_tokens,
    )
    if PREFIX_GROUP in columns:
        frame.insert(4, PREFIX_GROUP, nullable_counts(raw, PREFIX_GROUP, locator))
    if PREFIX_TOKENS in columns:
        position = 5 if PREFIX_GROUP in columns else 4
        frame.insert(position, PREFIX_TOKENS, token_counts(raw, PREFIX_TOKENS, locator))
    return frame
