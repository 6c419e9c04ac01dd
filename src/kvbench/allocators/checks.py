"""Argument checks the allocators share."""

from __future__ import annotations


def check_token_count(num_tokens: int) -> None:
    """Reject a negative token count (a caller bug, not a lack of memory)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens}: must be >= 0")
