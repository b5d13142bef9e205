"""Every relative link of the Markdown pages resolves: the file exists and so does the heading.

Headings become anchors as GitHub makes them: lower case, punctuation other than ``-`` and ``_``
dropped, spaces as ``-``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"})
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        missing_anchor = linked.exists() and anchor and linked.suffix == ".md"
        if not linked.exists() or (missing_anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"
