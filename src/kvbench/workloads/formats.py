"""The trace formats kvbench reads: one :class:`TraceSchema` entry per format, its converter on it.

Adding a format is one entry in :data:`SCHEMAS` (its columns, its signature, its converter).
Formats that already hold token counts (Vidur, Azure, Mooncake, lengths, kvbench's parquet) are
converted column by column; raw-text datasets (Alpaca, ShareGPT) are tokenized.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from kvbench.workloads.frame import (
    block_hash_lists,
    nullable_counts,
    optional_seconds,
    require_columns,
    seconds,
    seconds_since_first,
    shown,
    token_counts,
    trace_frame,
)
from kvbench.workloads.raw_reading import saved_hash_block_tokens
from kvbench.workloads.schema import (
    ARRIVAL_S,
    CSV,
    HASH_BLOCK_TOKENS_ATTR,
    MOONCAKE_HASH_BLOCK_TOKENS,
    OUTPUT_TOKENS,
    PARQUET,
    PREFIX_BLOCK_HASHES,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PROMPT_TOKENS,
    REQUEST_ID,
    ReadOptions,
    RowLocator,
    TraceError,
    TraceSchema,
)
from kvbench.workloads.tokenizer import OFFLINE_TOKENIZER_NAME, count_tokens, load_tokenizer

_MS_PER_S = 1000.0
# ShareGPT dumps name the user "human" (sometimes "user") and the model "gpt" (or the service).
_USER_ROLES = frozenset({"human", "user"})
_ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing"})

# --- Formats that hold token counts ---


def from_vidur(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """Vidur/Sarathi CSV: ``num_prefill_tokens, num_decode_tokens[, arrived_at]`` (seconds)."""
    require_columns(raw, VIDUR_SCHEMA, locator)
    return trace_frame(
        prompt_tokens=token_counts(raw, "num_prefill_tokens", locator),
        output_tokens=token_counts(raw, "num_decode_tokens", locator),
        arrival_s=optional_seconds(raw, "arrived_at", locator),
    )


def from_azure(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """Azure LLM inference CSV; arrival_s counts seconds from the earliest TIMESTAMP."""
    require_columns(raw, AZURE_SCHEMA, locator)
    return trace_frame(
        prompt_tokens=token_counts(raw, "ContextTokens", locator),
        output_tokens=token_counts(raw, "GeneratedTokens", locator),
        arrival_s=seconds_since_first(raw, "TIMESTAMP", locator),
    )


def from_mooncake(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """Mooncake JSONL: ``timestamp`` (ms), lengths, and ``hash_ids`` of 512-token blocks."""
    require_columns(raw, MOONCAKE_SCHEMA, locator)
    has_hashes = "hash_ids" in raw.columns
    return trace_frame(
        prompt_tokens=token_counts(raw, "input_length", locator),
        output_tokens=token_counts(raw, "output_length", locator),
        arrival_s=seconds(raw, "timestamp", locator, unit_s=1 / _MS_PER_S),
        prefix_block_hashes=block_hash_lists(raw, "hash_ids", locator) if has_hashes else None,
        hash_block_tokens=MOONCAKE_HASH_BLOCK_TOKENS,
    )


def from_lengths(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """A lengths table: kvbench's own columns (CSV, JSONL or the parquet of ``save_trace``).

    ``prompt_tokens, output_tokens`` are required; ``request_id``, ``arrival_s`` and the prefix
    columns are kept when present, other columns are ignored. A parquet file brings back the
    ``hash_block_tokens`` that ``save_trace`` recorded in its metadata.
    """
    hash_block_tokens = 0
    if locator.container == PARQUET:
        hash_block_tokens = saved_hash_block_tokens(Path(locator.path))
    frame = _lengths_frame(raw, locator, hash_block_tokens)
    if not hash_block_tokens:
        frame.attrs.pop(HASH_BLOCK_TOKENS_ATTR, None)
    return frame


def _lengths_frame(raw: pd.DataFrame, locator: RowLocator, hash_block_tokens: int) -> pd.DataFrame:
    require_columns(raw, LENGTHS_SCHEMA, locator)
    columns = set(raw.columns)
    hashes = None
    if PREFIX_BLOCK_HASHES in columns:
        hashes = block_hash_lists(raw, PREFIX_BLOCK_HASHES, locator)
        _require_hash_block_tokens(hashes, hash_block_tokens, locator)
    frame = trace_frame(
        prompt_tokens=token_counts(raw, PROMPT_TOKENS, locator),
        output_tokens=token_counts(raw, OUTPUT_TOKENS, locator),
        arrival_s=optional_seconds(raw, ARRIVAL_S, locator),
        request_ids=(token_counts(raw, REQUEST_ID, locator, "a non-negative integer request id")
                     if REQUEST_ID in columns else None),
        prefix_block_hashes=hashes,
        hash_block_tokens=hash_block_tokens,
    )
    if PREFIX_GROUP in columns:
        frame.insert(4, PREFIX_GROUP, nullable_counts(raw, PREFIX_GROUP, locator))
    if PREFIX_TOKENS in columns:
        position = 5 if PREFIX_GROUP in columns else 4
        frame.insert(position, PREFIX_TOKENS, token_counts(raw, PREFIX_TOKENS, locator))
    return frame


def _require_hash_block_tokens(
    hashes: list[list[int]], hash_block_tokens: int, locator: RowLocator
) -> None:
    """Block hashes say which prompts share blocks only with the tokens each hash covers, which
    only ``save_trace``'s parquet metadata records: a TraceError at the first row with hashes
    when the file does not say."""
    if hash_block_tokens:
        return
    first = next((index for index, row in enumerate(hashes) if row), None)
    if first is not None:
        raise TraceError(locator.path, locator.row(first),
                         f"{PREFIX_BLOCK_HASHES} without the tokens each hash covers (a "
                         f"{HASH_BLOCK_TOKENS_ATTR} that only the parquet metadata save_trace "
                         "writes records)",
                         "a parquet file written by kvbench.workloads.save_trace with "
                         f"{HASH_BLOCK_TOKENS_ATTR} in its attrs, a Mooncake JSONL (hash_ids of "
                         f"{MOONCAKE_HASH_BLOCK_TOKENS}-token blocks), or the file without the "
                         f"{PREFIX_BLOCK_HASHES} column")


# --- Raw-text formats (tokenized) ---


def _column_values(raw: pd.DataFrame, column: str, locator: RowLocator) -> list[Any]:
    """``raw[column]`` as Python values; a TraceError naming the first row whose bytes are not
    UTF-8 text (a parquet file may declare a string column and hold other bytes: pyarrow refuses
    them only when they are converted)."""
    values = raw[column]
    try:
        return values.tolist()
    except pa.ArrowException:
        for index in range(len(values)):
            try:
                values.iloc[index : index + 1].tolist()
            except pa.ArrowException:
                raise TraceError(locator.path, locator.row(index),
                                 f"{column} holds bytes that are not UTF-8 text",
                                 "a string") from None  # fmt: skip
        raise


def _texts(
    raw: pd.DataFrame, column: str, locator: RowLocator, missing_is_empty: bool = False
) -> list[str]:
    """``raw[column]`` as strings. Every CSV cell is text, read as written (raw_reading keeps
    these columns' cells as text): an empty cell is the empty text (a CSV cannot tell it from a
    missing one). Elsewhere a value that is not a string is an error, and so is a missing one
    unless ``missing_is_empty`` (Alpaca's optional ``input``)."""
    texts = _column_values(raw, column, locator)
    is_csv = locator.container == CSV
    for index, text in enumerate(texts):
        if isinstance(text, str):
            continue
        is_missing = text is None or (isinstance(text, float) and np.isnan(text))
        if is_missing and (missing_is_empty or is_csv):
            texts[index] = ""
        else:
            problem = f"{column} is missing" if is_missing else f"{column} = {shown(text)}"
            raise TraceError(locator.path, locator.row(index), problem, "a string")
    return texts


def alpaca_prompts(instructions: Iterable[str], inputs: Iterable[str]) -> list[str]:
    """Alpaca prompts as the vLLM paper counts them: instruction, newline, input (if any)."""
    return [f"{instruction}\n{extra}" if extra else instruction
            for instruction, extra in zip(instructions, inputs, strict=True)]


def from_alpaca(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """Alpaca records ``{instruction, input, output}``: prompt = instruction + "\\n" + input (when
    input is not empty), output = the output text; no template, no special tokens."""
    require_columns(raw, ALPACA_SCHEMA, locator)
    instructions = _texts(raw, "instruction", locator)
    inputs = (_texts(raw, "input", locator, missing_is_empty=True) if "input" in raw.columns
              else [""] * len(raw))  # fmt: skip
    outputs = _texts(raw, "output", locator)
    return _tokenized_frame(alpaca_prompts(instructions, inputs), outputs,
                            np.arange(len(raw)), options)


def first_exchange(turns: Iterable[dict[str, object]]) -> tuple[str, str] | None:
    """(prompt, answer): the first user turn and the assistant turn right after it, or None."""
    turn_list = list(turns)
    for position, turn in enumerate(turn_list[:-1]):
        if turn.get("from") in _USER_ROLES:
            answer = turn_list[position + 1]
            if answer.get("from") in _ASSISTANT_ROLES:
                return str(turn.get("value") or ""), str(answer.get("value") or "")
            return None
    return None


def _first_exchange_of_row(
    turns: object, index: int, locator: RowLocator
) -> tuple[str, str] | None:
    """``first_exchange`` of one record's ``conversations`` (None when it has none: a missing
    value skips the record like a conversation without a pair); a TraceError names a record whose
    conversations are not a list of turn objects."""
    if turns is None or (isinstance(turns, float) and np.isnan(turns)):
        return None
    if not isinstance(turns, list | tuple | np.ndarray) or not all(
        isinstance(turn, dict) for turn in turns
    ):
        raise TraceError(locator.path, locator.row(index),
                         f"conversations = {shown(turns)} is not a list of turns",
                         'a list of turns such as {"from": "human", "value": "..."}')
    return first_exchange(turns)


def from_sharegpt(raw: pd.DataFrame, locator: RowLocator, options: ReadOptions) -> pd.DataFrame:
    """ShareGPT conversations: the first human turn is the prompt, the gpt turn that follows it
    the output. (vLLM's benchmark_serving takes a conversation's first two turns whatever their
    roles; the two differ only on conversations that do not open with a human turn answered by
    gpt.) Conversations without such a pair are skipped;
    ``request_id`` keeps the record's position in the file and ``attrs["num_skipped"]`` counts
    the skipped ones."""
    require_columns(raw, SHAREGPT_SCHEMA, locator)
    prompts, outputs, record_ids = [], [], []
    for index, turns in enumerate(raw["conversations"]):
        exchange = _first_exchange_of_row(turns, index, locator)
        if exchange is not None:
            prompts.append(exchange[0])
            outputs.append(exchange[1])
            record_ids.append(index)
    if not record_ids:
        raise TraceError(locator.path, locator.row(0), "no record's conversations hold a human "
                         "turn followed by a gpt turn",
                         "ShareGPT records with conversations [{from, value}]")
    frame = _tokenized_frame(prompts, outputs, np.array(record_ids), options)
    frame.attrs["num_skipped"] = len(raw) - len(record_ids)
    return frame


def _tokenized_frame(
    prompts: list[str], outputs: list[str], record_ids: np.ndarray, options: ReadOptions
) -> pd.DataFrame:
    tokenizer = load_tokenizer(options.tokenizer)
    frame = trace_frame(
        prompt_tokens=count_tokens(prompts, tokenizer, options.show_progress),
        output_tokens=count_tokens(outputs, tokenizer, options.show_progress),
        request_ids=record_ids,
    )
    frame.attrs["tokenizer"] = options.tokenizer or OFFLINE_TOKENIZER_NAME
    return frame


# --- The table ---

VIDUR_SCHEMA = TraceSchema(
    "vidur", ("num_prefill_tokens", "num_decode_tokens"),
    ("num_prefill_tokens", "num_decode_tokens"),
    "num_prefill_tokens,num_decode_tokens[,arrived_at] (Vidur/Sarathi CSV)",
    from_vidur,
)
AZURE_SCHEMA = TraceSchema(
    "azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM inference CSV)",
    from_azure,
)
MOONCAKE_SCHEMA = TraceSchema(
    "mooncake", ("timestamp", "input_length", "output_length"),
    ("input_length", "output_length", "hash_ids"),
    "timestamp,input_length,output_length[,hash_ids] (Mooncake JSONL)",
    from_mooncake,
)
ALPACA_SCHEMA = TraceSchema(
    "alpaca", ("instruction", "output"), ("instruction",),
    "instruction,input,output (Alpaca JSON list)",
    from_alpaca,
)
SHAREGPT_SCHEMA = TraceSchema(
    "sharegpt", ("conversations",), ("conversations",),
    "id,conversations[{from,value}] (ShareGPT JSON list)",
    from_sharegpt,
)
LENGTHS_SCHEMA = TraceSchema(
    "lengths", ("prompt_tokens", "output_tokens"), ("prompt_tokens", "output_tokens"),
    "prompt_tokens,output_tokens[,arrival_s] (lengths CSV)",
    from_lengths,
)
# kvbench's own parquet (save_trace) carries the lengths columns plus request_id and prefixes.
PARQUET_SCHEMA = TraceSchema(
    "parquet", ("prompt_tokens", "output_tokens"), (),
    "request_id,arrival_s,prompt_tokens,output_tokens (kvbench parquet)",
    from_lengths,
)

# Detection order matters only for headers that carry signatures of two formats.
SCHEMAS = (VIDUR_SCHEMA, AZURE_SCHEMA, MOONCAKE_SCHEMA, SHAREGPT_SCHEMA, ALPACA_SCHEMA,
           LENGTHS_SCHEMA, PARQUET_SCHEMA)
SCHEMAS_BY_NAME = {schema.name: schema for schema in SCHEMAS}
FORMAT_NAMES = ("auto", *SCHEMAS_BY_NAME)


def schema_from_columns(columns: tuple[str, ...]) -> TraceSchema | None:
    """The first format whose signature columns appear in ``columns``, or None."""
    present = set(columns)
    return next((s for s in SCHEMAS if present.intersection(s.signature)), None)


def known_formats_text() -> str:
    """The formats kvbench reads, for error messages."""
    return " | ".join(schema.description for schema in SCHEMAS if schema.signature)


def resolve_schema(format: str, columns: tuple[str, ...], locator: RowLocator) -> TraceSchema:
    """The format named ``format``, or for ``auto`` the one ``columns`` identify (a lengths
    table in a parquet file is kvbench's own parquet).

    Raises:
        TraceError: ``auto`` and the columns match no known format.
    """
    if format != "auto":
        return SCHEMAS_BY_NAME[format]
    schema = schema_from_columns(columns)
    if schema is None:
        found = ",".join(columns) or "no column names"
        raise TraceError(locator.path, locator.header(),
                         f"columns {found} match no known trace format",
                         f"one of: {known_formats_text()}")
    if schema is LENGTHS_SCHEMA and locator.container == PARQUET:
        return PARQUET_SCHEMA
    return schema
