"""The Python examples of the README and of docs/ run as written, so they cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (f"{page.relative_to(ROOT)} python block {number}", block)
    for page in PAGES
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL), 1)
]


def test_the_library_guide_has_its_quick_start():
    assert any(name.startswith("docs/library.md") for name, _ in BLOCKS), "no python block in docs/library.md"


@pytest.mark.parametrize(("name", "block"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_python_block_runs(name, block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # relative SQLite paths land here
    code = compile(block, name, "exec")
    exec(code, {"__name__": "__readme__"})
    # Any number of times, in the same directory (it left its database behind once).
    exec(code, {"__name__": "__readme__"})


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_no_line_is_wider_than_100_columns(page):
    """A terminal or a diff shows every line whole (issue 38)."""
    wide = [n for n, line in enumerate(page.read_text().splitlines(), 1) if len(line) > 100]
    assert wide == [], f"{page.name}: lines {wide} are over 100 columns"
