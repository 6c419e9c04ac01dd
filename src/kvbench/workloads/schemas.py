"""The trace formats kvbench reads: their columns, and how to recognise one from its columns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceSchema:
    """One trace format: the columns it must have and those that identify it."""

    name: str
    required: tuple[str, ...]
    # Any of these columns in a header means "this format" (then missing required ones are
    # reported as missing, instead of "unknown format").
    signature: tuple[str, ...]
    description: str


VIDUR = TraceSchema(
    "vidur", ("num_prefill_tokens", "num_decode_tokens"),
    ("num_prefill_tokens", "num_decode_tokens"),
    "num_prefill_tokens,num_decode_tokens[,arrived_at] (Vidur/Sarathi CSV)",
)
AZURE = TraceSchema(
    "azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM inference CSV)",
)
MOONCAKE = TraceSchema(
    "mooncake", ("timestamp", "input_length", "output_length"),
    ("input_length", "output_length", "hash_ids"),
    "timestamp,input_length,output_length[,hash_ids] (Mooncake JSONL)",
)
ALPACA = TraceSchema(
    "alpaca", ("instruction", "output"), ("instruction",),
    "instruction,input,output (Alpaca JSON list)",
)
SHAREGPT = TraceSchema(
    "sharegpt", ("conversations",), ("conversations",),
    "id,conversations[{from,value}] (ShareGPT JSON list)",
)
LENGTHS = TraceSchema(
    "lengths", ("prompt_tokens", "output_tokens"), ("prompt_tokens", "output_tokens"),
    "prompt_tokens,output_tokens[,arrival_s] (lengths CSV)",
)
# kvbench's own parquet (save_trace) carries the lengths columns plus request_id and prefixes.
PARQUET = TraceSchema(
    "parquet", ("prompt_tokens", "output_tokens"), (),
    "request_id,arrival_s,prompt_tokens,output_tokens (kvbench parquet)",
)

# Detection order matters only for headers that carry signatures of two formats.
SCHEMAS = (VIDUR, AZURE, MOONCAKE, SHAREGPT, ALPACA, LENGTHS, PARQUET)
SCHEMAS_BY_NAME = {schema.name: schema for schema in SCHEMAS}
FORMAT_NAMES = ("auto", *SCHEMAS_BY_NAME)


def schema_from_columns(columns: tuple[str, ...]) -> TraceSchema | None:
    """The first format whose signature columns appear in ``columns``, or None."""
    present = set(columns)
    return next((s for s in SCHEMAS if present.intersection(s.signature)), None)


def known_formats_text() -> str:
    """The formats kvbench reads, for error messages."""
    return " | ".join(schema.description for schema in SCHEMAS if schema.signature)
