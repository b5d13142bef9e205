"""How every report writes numbers (``fmt``, ``times``), Markdown tables, their legends
(from ``legends.md``), prose wrapped to :data:`WIDTH` columns (``wrap``), JSON (``null`` where a
measurement is missing or unbounded) and CSV (the wide detail the Markdown leaves out)."""

from __future__ import annotations

import csv
import functools
import json
import math
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "WIDTH",
    "Columns",
    "fmt",
    "legend",
    "markdown",
    "ratio",
    "table",
    "times",
    "wrap",
    "write_csv",
    "write_json",
]

#: The widest line a report prints or writes: a terminal of 100 columns shows it unbroken.
WIDTH = 100

#: A table's columns: header -> the row's key (shown with ``fmt``) or what shows the row's cell.
Columns = Mapping[str, str | Callable[[dict[str, Any]], str]]


def fmt(value: Any, digits: int = 1) -> str:
    """A cell: ``-`` for nothing measured (None, NaN), ``yes``/``NO`` for a check, numbers with commas."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:,.{digits}f}"
    return value if isinstance(value, str) else f"{value:,}"


def times(value: float) -> str:
    """A ratio cell: ``1.50x``; ``-`` when either side was not measured."""
    return "-" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.2f}x")


def ratio(a: float, b: float) -> float:
    """``a / b``: NaN if either is NaN or both are 0, inf for something over 0."""
    if math.isnan(a) or math.isnan(b) or (a == 0 and b == 0):
        return math.nan
    return math.inf if b == 0 else a / b


def markdown(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 2) -> str:
    """A Markdown (pipe) table of text cells: the first ``left`` columns flush left, the rest (numbers)
    right; each column as wide as its widest cell, no wider, so that the table's width is foreseeable."""
    widths = [max(map(len, column)) for column in zip(header, *body, strict=True)]

    def row(cells: Sequence[str]) -> str:
        padded = (
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "| " + " | ".join(padded) + " |"

    rule = [":" + "-" * (w + 1) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)]
    return "\n".join([row(header), "|" + "|".join(rule) + "|", *map(row, body)])


def table(rows: Sequence[dict[str, Any]], columns: Columns, left: int = 2) -> str:
    """``markdown`` of ``rows``, one column per entry of ``columns``."""
    body = [[show(r) if callable(show) else fmt(r[show]) for show in columns.values()] for r in rows]
    return markdown(list(columns), body, left)


def wrap(text: str, width: int = WIDTH) -> str:
    """``text`` with every line longer than ``width`` wrapped at spaces: a ``* `` item or a ``> `` note
    continues indented or quoted; a table row (``|``) or a word longer than ``width`` (a path) stays
    as it is, so tables must be made narrow enough."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width or line.startswith("|"):
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        more = {"* ": "  ", "- ": "  ", "> ": "> "}.get(line.lstrip()[:2], "  " if lead else "")
        fill = textwrap.fill(
            line.lstrip(),
            width,
            initial_indent=lead,
            subsequent_indent=lead + more,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.append(fill)
    return "\n".join(out)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Columns) -> None:
    """``rows`` as CSV, one column per entry of ``columns``, cells as :func:`table` shows them."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(list(columns))
        writer.writerows(
            [show(r) if callable(show) else fmt(r[show]) for show in columns.values()] for r in rows
        )


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON: NaN and infinities as ``null`` (JSON has neither), anything else as text."""
    # Python's JSON writes them as NaN / Infinity, which its reader hands to parse_constant.
    plain = json.loads(json.dumps(data, default=str), parse_constant=lambda _: None)
    path.write_text(json.dumps(plain, indent=1) + "\n")


@functools.cache
def _legends() -> dict[str, str]:
    text = resources.files(__package__).joinpath("legends.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (\w+)\n", text, flags=re.M)
    return {name: body.rstrip("\n") + "\n" for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def legend(name: str, **fields: Any) -> str:
    """The legend ``name`` of ``legends.md``, each ``$field`` filled in: the value given (numbers as
    ``:g``), else another legend (``$rule``), else the name quoted."""

    def fill(match: re.Match[str]) -> str:
        if (key := match[1]) not in fields:
            return _legends()[key].rstrip("\n") if key in _legends() else f"`{key}`"
        value = fields[key]
        return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)

    return re.sub(r"\$(\w+)", fill, _legends()[name])
