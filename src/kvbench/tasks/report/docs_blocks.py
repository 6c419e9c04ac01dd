"""Generated blocks inside a hand-written markdown file.

``<!-- kvbench.report:BEGIN NAME -->`` ... ``<!-- kvbench.report:END NAME -->`` enclose a block
the report rewrites; everything outside the markers (the hand-written explanations) is kept.
"""

from __future__ import annotations

import re

BEGIN = "<!-- kvbench.report:BEGIN {name} -->"
END = "<!-- kvbench.report:END {name} -->"


def block(name: str, body: str) -> str:
    """``body`` between the markers of block ``name``."""
    return f"{BEGIN.format(name=name)}\n{body.strip()}\n{END.format(name=name)}"


def replace_blocks(text: str, bodies: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with each existing block's body replaced; returns it and the names not found."""
    missing = []
    for name, body in bodies.items():
        pattern = re.compile(
            re.escape(BEGIN.format(name=name)) + r".*?" + re.escape(END.format(name=name)),
            flags=re.S,
        )
        if not pattern.search(text):
            missing.append(name)
            continue
        replacement = block(name, body)
        text = pattern.sub(lambda _match, new=replacement: new, text)
    return text, missing
