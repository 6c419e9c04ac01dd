"""Every relative link in the README and docs/ reaches a file, and a heading where it names one."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def page_anchors(text: str) -> set[str]:
    """The anchors of a page's headings (outside code fences); a repeated one gets '-1', '-2'."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else re.match(r"#{1,6} (.*)", line)
        if match:
            anchor = heading_anchor(match.group(1))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        heading_missing = (linked.exists() and linked.suffix == ".md" and anchor != ""
                           and anchor not in page_anchors(linked.read_text()))  # fmt: skip
        if not linked.exists() or heading_missing:
            broken.append(target)
    return broken


def test_heading_anchors_are_githubs():
    text = "# A `b`, c (d)\n```\n# not a heading\n```\n## Again\n## Again\n"
    assert page_anchors(text) == {"a-b-c-d", "again", "again-1"}


def test_a_missing_file_and_a_missing_heading_are_found(tmp_path):
    (tmp_path / "other.md").write_text("## There\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#there) [b](other.md#gone) [c](nowhere.md) [d](#here)\n"
                    "## Here\n[e](https://example.com/x#y)\n")  # fmt: skip
    assert broken_links(page) == ["other.md#gone", "nowhere.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []
