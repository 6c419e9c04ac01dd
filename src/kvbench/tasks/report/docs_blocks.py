"""Generated blocks inside a hand-written markdown file.

``<!-- kvbench.report:BEGIN NAME -->`` ... ``<!-- kvbench.report:END NAME -->`` enclose a block
the report rewrites; everything outside the markers (the hand-written explanations) is kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable

BEGIN = "<!-- kvbench.report:BEGIN {name} -->"
END = "<!-- kvbench.report:END {name} -->"


def block(name: str, body: str) -> str:
    """``body`` between the markers of block ``name``."""
    return f"{BEGIN.format(name=name)}\n{body.strip()}\n{END.format(name=name)}"


def _literally(replacement: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement inserting ``replacement`` as is (a string would expand its
    backslashes)."""
    return lambda _match: replacement


def replace_blocks(text: str, bodies: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with each existing block's body replaced; returns it and the names not found."""
    missing: list[str] = []
    for name, body in bodies.items():
        pattern = re.compile(
            re.escape(BEGIN.format(name=name)) + r".*?" + re.escape(END.format(name=name)),
            flags=re.S,
        )
        if not pattern.search(text):
            missing.append(name)
            continue
        text = pattern.sub(_literally(block(name, body)), text)
    return text, missing
