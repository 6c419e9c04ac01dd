"""Developer tools: the engine benchmark and the kernel-overhead CI gate, and one-off
measurements; :func:`count_at_least` is their command lines' shared check of a count."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def count_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer option of at least ``minimum`` (a thread, repeat or
    round count, a size): argparse refuses anything else in one line before any work, where a 0
    used to fail in torch or ``statistics`` after minutes of it."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small; expected >= {minimum}")
        return value

    return parse
