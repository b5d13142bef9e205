"""The verdict at the end of ``airflow-adrq bench``: what a user runs it for, each with its target.

One short table per run (at most 100 columns): per database, airflow-adrq's
default (``commit_time``) against the targets defined here, once. A ratio
is printed only where both sides finished their work; where the baseline
did not, the row says what did not finish instead. ``--check`` turns a
missed target into exit status 1, so an operator can run the benchmark in
their own CI against their own database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_adrq_bench.config import DEFAULT_STRATEGY
from airflow_adrq_bench.tables import markdown

#: The baselines: Airflow 3.3.2's own loop, and the same loop sorted (the seed's fix).
STOCK, SORTED = "airflow_3_3", "sorted_loop"


@dataclass(frozen=True)
class Target:
    """What is measured, the goal as printed, and whether a value meets it."""

    what: str
    goal: str
    met: Callable[[float], bool]


#: Every target of the standalone benchmark, in the order printed.
DEADLOCKS = Target("deadlocks", "0", lambda v: v == 0)
NOT_COMMITTED = Target("transactions not committed", "0", lambda v: v == 0)
ROWS_EXACT = Target("queue rows exact after every round", "all", lambda v: v == 1)
LOST = Target("events no run consumed, vs Airflow", "<= 0.2x", lambda v: v <= 0.2)
SPEED = Target("tx/s, single outlet, vs {base}", ">= 1x", lambda v: v >= 1)
RAW_SQL = Target("one call at F=1 vs raw SQL (p50)", "<= 2x", lambda v: v <= 2)


@dataclass(frozen=True)
class Line:
    """One row of the verdict."""

    db: str
    what: str
    goal: str
    measured: str
    verdict: str  # "met", "MISSED" or "n/a" (with the reason in ``measured``)


def _line(db: str, target: Target, value: float, shown: str, what: str | None = None) -> Line:
    verdict = "n/a" if math.isnan(value) else ("met" if target.met(value) else "MISSED")
    return Line(db, what or target.what, target.goal, shown, verdict)


def _unfinished(row: dict[str, Any]) -> int:
    return int(row["abandoned"] + row["not_started"])


def standalone(
    raw: dict[str, Any], rows: Sequence[dict[str, Any]], lost: Sequence[dict[str, Any]]
) -> list[Line]:
    """The verdict lines of a standalone run (``rows``, ``lost``: :mod:`.report`'s aggregates)."""
    lines: list[Line] = []
    for db in [t["name"] for t in raw["targets"]]:
        ours = [r for r in rows if r["db"] == db and r["strategy"] == DEFAULT_STRATEGY]
        if ours:
            deadlocks = sum(r["deadlocks"] for r in ours)
            lines.append(_line(db, DEADLOCKS, deadlocks, f"{deadlocks}"))
            unfinished, planned = sum(map(_unfinished, ours)), sum(r["planned"] for r in ours)
            lines.append(_line(db, NOT_COMMITTED, unfinished, f"{unfinished} of {planned}"))
            exact = all(r["rows_exact"] for r in ours)
            lines.append(_line(db, ROWS_EXACT, 1.0 if exact else 0.0, "all" if exact else "NOT all"))
        lines += _speed(db, rows)
        lines += _lost(db, lost)
        lines += _raw_sql(db, raw.get("raw_sql_ratio", {}).get(db, []))
    return lines


def _speed(db: str, rows: Sequence[dict[str, Any]]) -> list[Line]:
    by = {r["strategy"]: r for r in rows if r["db"] == db and r["scenario"] == "single"}
    ours = by.get(DEFAULT_STRATEGY)
    if ours is None:
        return []
    lines = []
    for base in (STOCK, SORTED):
        other = by.get(base)
        if other is None:
            continue
        what = SPEED.what.format(base=base)
        if _unfinished(ours):
            lines.append(Line(db, what, SPEED.goal, f"ours: {_unfinished(ours)} not committed", "MISSED"))
        elif _unfinished(other):
            # A ratio would measure the round's time budget, not speed: say what did not finish.
            shown = f"{base}: {_unfinished(other)} of {other['planned']} not committed"
            lines.append(Line(db, what, SPEED.goal, shown, "met"))
        else:
            ratio = ours["tx_per_s"] / other["tx_per_s"] if other["tx_per_s"] else math.nan
            lines.append(_line(db, SPEED, ratio, f"{ratio:.2f}x", what))
    return lines


def _lost(db: str, lost: Sequence[dict[str, Any]]) -> list[Line]:
    ours = [r for r in lost if r["db"] == db and r["strategy"] == DEFAULT_STRATEGY]
    stock = [r for r in lost if r["db"] == db and r["strategy"] == STOCK]
    if not ours or not stock:
        return []
    mine, theirs = sum(r["lost_pairs"] for r in ours), sum(r["lost_pairs"] for r in stock)
    value = 0.0 if mine == 0 else (mine / theirs if theirs else math.inf)
    return [_line(db, LOST, value, f"{mine} pairs vs {theirs}")]


def _raw_sql(db: str, results: Sequence[dict[str, Any]]) -> list[Line]:
    one = [r for r in results if r["fanout"] == 1]
    if not one:
        return []
    r = one[0]
    overlap = r["ours_p50_ms"] <= r["raw_p95_ms"] and r["raw_p50_ms"] <= r["ours_p95_ms"]
    shown = f"{r['ratio_p50']:.2f}x" + (" (spreads overlap)" if overlap else "")
    return [_line(db, RAW_SQL, r["ratio_p50"], shown)]


def missed(lines: Sequence[Line]) -> list[Line]:
    return [line for line in lines if line.verdict == "MISSED"]


def format_verdict(lines: Sequence[Line]) -> str:
    """The verdict as a Markdown table, with a one-line summary under it."""
    if not lines:
        return ""
    body = [[ln.db, ln.what, ln.goal, ln.measured, ln.verdict] for ln in lines]
    table = markdown(["database", "airflow-adrq (default)", "target", "measured", ""], body, left=2)
    failed = missed(lines)
    summary = (
        f"{len(failed)} of {len(lines)} targets missed: {', '.join(f'{m.db} {m.what}' for m in failed)}"
        if failed
        else f"all {sum(ln.verdict == 'met' for ln in lines)} targets met"
    )
    return f"## Verdict\n\n{table}\n\n{summary}\n"
