"""The verdict at the end of every ``airflow-adrq bench`` run: what a user runs it for, each with its target.

One short table per run (at most 100 columns) of :class:`Line` rows from :func:`line` and :func:`ratio_line`
(:func:`standalone` for the main run). A ratio is given only where both sides finished, judged on the range
their spreads allow: met, MISSED, or ``unclear`` (the target lies within the noise). ``--check`` turns a
miss into exit status 1. The raw-SQL ratio (:func:`raw_sql`) is judged in ``bench.md`` (:mod:`.report`).
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
#: How sure a timed side's figure is: (low, high), e.g. its median's 95 % interval.
Spread = tuple[float, float]
#: A JSON object of a run: its raw results, one record, a summary row.
Row = dict[str, Any]
Rows = Sequence[Row]


@dataclass(frozen=True)
class Target:
    """What is measured, the goal as printed, and whether a value meets it."""

    what: str
    goal: str
    met: Callable[[float], bool]


#: Every target of the standalone benchmark, in the order printed.
DEADLOCKS = Target("deadlocks", "0", lambda v: v == 0)
NOT_COMMITTED = Target("transactions not committed", "0", lambda v: v == 0)
ROWS_EXACT = Target("queue rows exact every round", "all", lambda v: v == 1)
LOST = Target("event-DAG pairs lost vs Airflow", "<= 0.2x", lambda v: v <= 0.2)
SPEED = Target("tx/s single outlet vs {base}", ">= 1x", lambda v: v >= 1)
RAW_SQL = Target("one call at F=1 vs raw SQL (p50)", "<= 2x", lambda v: v <= 2)


@dataclass(frozen=True)
class Line:
    """One row of the verdict."""

    db: str
    what: str
    goal: str
    measured: str
    verdict: str  # "met", "MISSED", "unclear" (within the noise) or "n/a" (the reason in ``measured``)


def line(db: str, target: Target, value: float, shown: str, what: str | None = None) -> Line:
    """``target`` judged on ``value`` (NaN: not measured, ``n/a``), ``shown`` as the measured cell."""
    verdict = "n/a" if math.isnan(value) else ("met" if target.met(value) else "MISSED")
    return Line(db, what or target.what, target.goal, shown, verdict)


def ratio_line(
    db: str,
    target: Target,
    ours: float,
    base: float,
    *,
    what: str | None = None,
    spreads: Sequence[Spread] | None = None,
    unfinished: Sequence[str] = ("", ""),
    shown: str = "",
) -> Line:
    """``ours / base`` judged by ``target``, unless a side did not finish; with the spread of the ratio.

    ``unfinished`` (ours, baseline): what each left undone (``""``: all done). Ours not done: MISSED; only
    the baseline not done: met (a ratio would measure the time budget, not speed). ``spreads`` (ours,
    baseline), each (low, high) as :func:`.stats.median_interval`: met if the target is met over the whole
    range of ratios they allow, MISSED if nowhere, else ``unclear``. ``shown``: the cell's text before it.
    """
    what = what or target.what
    if unfinished[0]:
        return Line(db, what, target.goal, f"ours: {unfinished[0]}", "MISSED")
    if unfinished[1]:
        return Line(db, what, target.goal, unfinished[1], "met")
    value = ours / base if base else math.nan
    if spreads is None or math.isnan(value) or any(math.isnan(v) for s in spreads for v in s):
        return line(db, target, value, f"{shown}{value:.2f}x", what)
    (ours_lo, ours_hi), (base_lo, base_hi) = spreads
    low, high = ours_lo / base_hi if base_hi else math.inf, ours_hi / base_lo if base_lo else math.inf
    overlap = ours_lo <= base_hi and base_lo <= ours_hi
    said = "spreads overlap" if overlap else f"{low:.2f}-{high:.2f}x"
    judged = {target.met(value), target.met(low), target.met(high)}
    verdict = "unclear" if len(judged) > 1 else ("met" if judged == {True} else "MISSED")
    return Line(db, what, target.goal, f"{shown}{value:.2f}x ({said})", verdict)


def standalone(raw: Row, rows: Rows, lost: Rows) -> list[Line]:
    """The verdict lines of a standalone run (``rows``, ``lost``: :mod:`.report`'s aggregates)."""
    lines: list[Line] = []
    for db in [t["name"] for t in raw["targets"]]:
        if ours := [r for r in rows if r["db"] == db and r["strategy"] == DEFAULT_STRATEGY]:
            deadlocks = sum(r["deadlocks"] for r in ours)
            unfinished = sum(r["abandoned"] + r["not_started"] for r in ours)
            exact = all(r["rows_exact"] for r in ours)
            lines += [
                line(db, DEADLOCKS, deadlocks, f"{deadlocks}"),
                line(db, NOT_COMMITTED, unfinished, f"{unfinished} of {sum(r['planned'] for r in ours)}"),
                line(db, ROWS_EXACT, 1.0 if exact else 0.0, "all" if exact else "NOT all"),
            ]
        lines += [*_speed(db, rows), *_lost(db, lost)]
    return lines


def _not_done(row: Row, who: str = "") -> str:
    """What ``row`` left undone, as a verdict cell says it; ``""`` if it committed everything."""
    n = row["abandoned"] + row["not_started"]
    return f"{who}{n} of {row['planned']} not committed" if n else ""


def rate_spread(row: Row) -> Spread:
    """How sure a row's tx/s is: the range of its rounds, or with one round its rate scaled by its
    transactions' median latency interval (rate x p50/high .. rate x p50/low)."""
    rates = row.get("round_tx_per_s", [])
    if len(rates) > 1:
        return (min(rates), max(rates))
    (low, high), p50 = _interval(row), row.get("p50_ms", math.nan)
    if not (low > 0 and high > 0):  # not measured (NaN) or nothing to scale by
        return (math.nan, math.nan)
    return (row["tx_per_s"] * p50 / high, row["tx_per_s"] * p50 / low)


def _interval(row: Row, prefix: str = "") -> Spread:
    """The row's median latency interval (:func:`.stats.latency`'s ``ci_*_ms``)."""
    return (row.get(f"{prefix}ci_low_ms", math.nan), row.get(f"{prefix}ci_high_ms", math.nan))


def _speed(db: str, rows: Rows) -> list[Line]:
    """Ours against each baseline in the single-outlet scenario: tx/s, with its spread."""
    by = {r["strategy"]: r for r in rows if r["db"] == db and r["scenario"] == "single"}
    ours = by.get(DEFAULT_STRATEGY, {})
    return [
        ratio_line(
            db,
            SPEED,
            ours["tx_per_s"],
            by[base]["tx_per_s"],
            what=SPEED.what.format(base=base),
            spreads=(rate_spread(ours), rate_spread(by[base])),
            unfinished=(_not_done(ours), _not_done(by[base], f"{base}: ")),
        )
        for base in (STOCK, SORTED)
        if ours and base in by
    ]


def _lost(db: str, lost: Rows) -> list[Line]:
    """Pairs ours lost over Airflow's, judged on the counts' noise (about 95 %: n +- 1.96 sqrt(n))."""
    mine = [r["lost_pairs"] for r in lost if r["db"] == db and r["strategy"] == DEFAULT_STRATEGY]
    theirs = [r["lost_pairs"] for r in lost if r["db"] == db and r["strategy"] == STOCK]
    if not mine or not theirs:
        return []
    ours, stock = sum(mine), sum(theirs)
    shown = f"{ours}/{stock}"  # pairs: ours / Airflow's
    if ours == 0 or stock == 0:
        return [line(db, LOST, 0.0 if ours == 0 else math.inf, shown)]
    spreads = [(max(0.0, n - 1.96 * math.sqrt(n)), n + 1.96 * math.sqrt(n)) for n in (ours, stock)]
    return [ratio_line(db, LOST, ours, stock, spreads=spreads, shown=f"{shown} ")]


def raw_sql(db: str, results: Rows) -> Line | None:
    """One call at F=1 against the same work in raw SQL (``bench.md``'s ratio table), judged."""
    if (one := next((r for r in results if r["fanout"] == 1), None)) is None:
        return None
    spreads = (_interval(one, "ours_"), _interval(one, "raw_"))
    return ratio_line(db, RAW_SQL, one["ours_p50_ms"], one["raw_p50_ms"], spreads=spreads)


def missed(lines: Sequence[Line]) -> list[Line]:
    """The lines whose target was missed."""
    return [ln for ln in lines if ln.verdict == "MISSED"]


def format_verdict(lines: Sequence[Line]) -> str:
    """The verdict as a Markdown table, with a one-line summary under it."""
    if not lines:
        return ""
    body = [[ln.db, ln.what, ln.goal, ln.measured, ln.verdict] for ln in lines]
    table = markdown(["database", "airflow-adrq (default)", "target", "measured", ""], body, left=2)
    failed, unclear = missed(lines), [ln for ln in lines if ln.verdict == "unclear"]
    summary = (
        f"{len(failed)} of {len(lines)} targets missed: {', '.join(f'{m.db} {m.what}' for m in failed)}"
        if failed
        else f"all {sum(ln.verdict == 'met' for ln in lines)} targets met"
    )
    if unclear:
        summary += f"; {len(unclear)} unclear (the target is within the measurement's noise)"
    return f"## Verdict\n\n{table}\n\n{summary}\n"
