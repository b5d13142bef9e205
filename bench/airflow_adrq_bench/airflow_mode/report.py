"""The results of the Airflow modes: what they all share (the raw fields they open and close with, the
detail's heading, the end of a run: the verdict printed, JSON and Markdown written), then ``--airflow``'s
summaries, verdict (judged by :data:`SPEED_TARGETS` and the shared :mod:`.verdict` targets) and Markdown
tables (with their legend)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_adrq_bench import options, tables
from airflow_adrq_bench.exits import Outcome
from airflow_adrq_bench.stats import latency, median
from airflow_adrq_bench.tables import fmt, ratio, times
from airflow_adrq_bench.verdict import (
    DEADLOCKS,
    NOT_COMMITTED,
    ROWS_EXACT,
    Line,
    Target,
    format_verdict,
    line,
    rate_spread,
    ratio_line,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def raw_opening(tool: str, sizes: DataclassInstance, managers: Sequence[str]) -> dict[str, Any]:
    """The first fields of a raw result: the tool, the start time, CPUs, load, sizes, managers."""
    return {
        "tool": tool,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        # Other work on the machine skews every number: the 1/5/15-minute load at start and end.
        "load_average": {"start": list(os.getloadavg())},
        "sizes": dataclasses.asdict(sizes),
        "managers": list(managers),
    }


def raw_finish(raw: dict[str, Any], started: float) -> None:
    """Add the run's duration since ``started`` (``time.monotonic()``) and the load at its end."""
    raw["duration_s"] = round(time.monotonic() - started, 1)
    raw["load_average"]["end"] = list(os.getloadavg())


def heading(title: str, raw: dict[str, Any]) -> str:
    """The detail's first line: what ran, on which Airflow, CPUs and 1-minute load (start, end)."""
    loads = ", ".join(f"{k} {v[0]:.1f}" for k, v in raw["load_average"].items())
    return f"## {title}: Apache Airflow {raw.get('airflow_version', '?')}, {raw['cpus']} CPUs (load {loads})"


def conclude(stem: Path, raw: dict[str, Any], detail: str, lines: Sequence[Line], judged: Outcome) -> int:
    """Write ``raw`` with the verdict ``lines`` and why the run failed (``judged``) as ``stem.json`` and
    ``detail`` with the verdict as ``stem.md``; print the verdict, the files and the reasons; the exit
    status ``judged`` gives."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    raw |= {"verdict": [dataclasses.asdict(line) for line in lines], "problems": judged.reasons}
    tables.write_json(stem.with_suffix(".json"), raw)
    shown, md = format_verdict(lines), stem.with_suffix(".md")
    written = [stem.with_suffix(".json")]
    return options.publish(md, f"{detail}\n{shown}", written, judged, took=raw["duration_s"], shown=shown)


def _at_least(factor: float) -> Target:
    return Target("", f">= {factor:g}x", lambda value: value >= factor)


#: The plug-in's speed targets per database: one caller at fan-out F against stock (calls per second
#: at the median), and 8 producers' committed tx/s against sorted_loop's (``contention``, judged at the
#: default contention sizes only). The other targets are the shared ones of :mod:`.verdict`.
SPEED_TARGETS: dict[str, dict[str, Target]] = {
    db: {goal: _at_least(factor) for goal, factor in factors.items()}
    for db, factors in {
        "postgresql": {"F=1": 1.0, "F=64": 2.5, "F=1024": 4.0, "contention": 2.0},
        "mariadb": {"F=1": 1.0, "F=64": 20.0, "F=1024": 100.0, "contention": 15.0},
    }.items()
}

_FAILURES = ("deadlock", "lock_timeout", "serialization", "busy", "connection_lost")
Row = dict[str, Any]
Summary = dict[str, list[Row]]


def _find(rows: Sequence[Row], **match: Any) -> Row:
    """The first row with every ``match`` (empty if none)."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), {})


def _grouped(records: Sequence[Row], *keys: str) -> list[tuple[Row, list[Row]]]:
    """``records`` grouped by their ``keys``, in run order: ``({key: value}, the group's records)``."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for record in records:
        groups[tuple(record[k] for k in keys)].append(record)
    return [(dict(zip(keys, key, strict=True)), group) for key, group in groups.items()]


def summarize(raw: dict[str, Any]) -> Summary:
    """Sweep rows per (db, fan-out, manager), contention rows per (db, scenario, manager), in run order."""
    sweep = []
    for where, records in _grouped(raw["sweep"], "db", "fanout", "manager"):
        measured = [r for r in records if not r["warmup"]]
        sweep.append(
            {
                **where,
                "calls": len(measured),
                **latency([r["latency_s"] * 1000 for r in measured]),
                "statements": median([r["statements"] for r in measured]),
                "rows_exact": all(r["rows_exact"] for r in records),
            }
        )
    for row in sweep:
        stock = _find(sweep, db=row["db"], fanout=row["fanout"], manager="stock")
        row["vs_stock"] = ratio(stock.get("p50_ms", math.nan), row["p50_ms"])

    contention = []
    for where, rounds in _grouped(raw["rounds"], "db", "scenario", "manager"):
        txs = [tx for r in rounds for tx in r["transactions"]]
        ok = [tx for tx in txs if tx["ok"]]
        duration = sum(r["duration_s"] for r in rounds)
        contention.append(
            {
                **where,
                "rounds": len(rounds),
                "planned": len(txs),
                "committed": len(ok),
                "abandoned": len(txs) - len(ok),
                **{f"{f}s": sum(tx["failures"].get(f, 0) for tx in txs) for f in _FAILURES},
                "retries": sum(max(0, tx["attempts"] - 1) for tx in txs),
                "duration_s": duration,
                "tx_per_s": len(ok) / duration if duration > 0 else math.nan,
                "round_tx_per_s": [r["committed"] / r["duration_s"] for r in rounds if r["duration_s"] > 0],
                **latency([tx["latency_s"] * 1000 for tx in ok]),
                "statements": median([tx["statements"] for tx in ok]),
                "rows_exact": all(r["rows_exact"] for r in rounds),
                "ended": sum(r["ended_transactions"] for r in rounds),
            }
        )
    for row in contention:
        for base in ("sorted_loop", "stock"):
            other = _find(contention, db=row["db"], scenario=row["scenario"], manager=base)
            # No ratio over a side that did not finish its transactions: it would measure the budget.
            finished = not other.get("abandoned") and not row["abandoned"]
            theirs = other.get("tx_per_s", math.nan) if finished else math.nan
            row[f"vs_{base}"] = ratio(row["tx_per_s"], theirs)
    return {"sweep": sweep, "contention": contention}


def verdict(raw: dict[str, Any], summary: Summary) -> list[Line]:
    """Per database: the plug-in's deadlocks, transactions not committed and exact rows, then its speed
    against stock (one caller) and sorted_loop (contention), each judged against its target."""
    s = raw["sizes"]
    # The contention goal is about 8 producers at fan-out 64 with a 5 ms hold: judged at those sizes only.
    at_goal_sizes = (s["producers"], s["fanout"], s["hold_ms"]) == (8, 64, 5.0)
    lines = []
    for db in [t["name"] for t in raw["targets"]]:
        sweep, rows = ([r for r in summary[k] if r["db"] == db] for k in ("sweep", "contention"))
        ours = [r for r in rows if r["manager"] == "plugin"]
        if ours:
            deadlocks, failed = sum(r["deadlocks"] for r in ours), sum(r["abandoned"] for r in ours)
            lines.append(line(db, DEADLOCKS, deadlocks, f"{deadlocks}"))
            lines.append(line(db, NOT_COMMITTED, failed, f"{failed} of {sum(r['planned'] for r in ours)}"))
        exact = all(r["rows_exact"] for r in [*sweep, *rows] if r["manager"] == "plugin")
        if sweep or ours:
            # After every call and round; shorter than the shared wording, to keep the table narrow.
            what = "queue rows exact throughout"
            lines.append(line(db, ROWS_EXACT, float(exact), "all" if exact else "NOT all", what))
        goals = SPEED_TARGETS.get(db, {})
        for fanout in s["fanouts"]:
            mine, stock = (_find(sweep, fanout=fanout, manager=m) for m in ("plugin", "stock"))
            if mine and stock and f"F={fanout}" in goals:
                # Calls per second at the median, and over the median's 95 % interval (its spread).
                a, b = (1000 / r["p50_ms"] for r in (mine, stock))
                spreads = [(1000 / r["ci_high_ms"], 1000 / r["ci_low_ms"]) for r in (mine, stock)]
                what = f"one caller F={fanout:,} vs stock"
                lines.append(ratio_line(db, goals[f"F={fanout}"], a, b, what=what, spreads=spreads))
        for scenario in raw["scenarios"] if "contention" in goals and at_goal_sizes else []:
            mine, base = (_find(rows, scenario=scenario, manager=m) for m in ("plugin", "sorted_loop"))
            if mine and base:
                spreads = [rate_spread(mine), rate_spread(base)]
                unfinished = (_unfinished(mine), _unfinished(base, "sorted: "))
                what = f"tx/s {scenario} vs sorted"
                args = (db, goals["contention"], mine["tx_per_s"], base["tx_per_s"])
                lines.append(ratio_line(*args, what=what, spreads=spreads, unfinished=unfinished))
    return lines


def _unfinished(row: Row, who: str = "") -> str:
    return f"{who}{row['abandoned']} of {row['planned']} not committed" if row["abandoned"] else ""


_SWEEP: tables.Columns = {
    "fan-out": lambda r: f"F={r['fanout']:,}",
    "manager": "manager",
    "calls": "calls",
    "p50 ms": lambda r: fmt(r["p50_ms"], 2),
    "p25-p75 ms": lambda r: f"{fmt(r['p25_ms'], 2)}-{fmt(r['p75_ms'], 2)}",
    "p95 ms": lambda r: fmt(r["p95_ms"], 2),
    "stmts/call": lambda r: fmt(float(r["statements"]), 0),
    "x vs stock": lambda r: times(r["vs_stock"]),
    "rows exact": "rows_exact",
}
_CONTENTION: tables.Columns = {
    "scenario": "scenario",
    "manager": "manager",
    "ok": "committed",
    "gave up": "abandoned",
    "deadlocks": "deadlocks",
    "lock t/o": "lock_timeouts",
    "serial.": "serializations",
    "busy": "busys",
    "tx/s": "tx_per_s",
    "x vs sorted_loop": lambda r: times(r["vs_sorted_loop"]),
    "p50 ms": "p50_ms",
    "p99 ms": "p99_ms",
    "max ms": "max_ms",
    "stmts/tx": lambda r: fmt(float(r["statements"]), 0),
    "rows exact": "rows_exact",
}


def format_tables(raw: dict[str, Any], summary: Summary) -> str:
    """Markdown: per database the one-caller table and the contention table; then the legend."""
    s = raw["sizes"]
    out = [heading("airflow-adrq bench --airflow", raw) + "\n"]
    for target in raw["targets"]:
        db = target["name"]
        settings = ", ".join(f"{k} {v}" for k, v in target.get("settings", {}).items())
        out.append(f"### {target['version']}" + (f" ({settings})" if settings else "") + "\n")
        sweep, rows = ([r for r in summary[k] if r["db"] == db] for k in ("sweep", "contention"))
        if sweep:
            out += ["One caller: register_asset_change + COMMIT, empty queue\n", tables.table(sweep, _SWEEP)]
            out.append("")
        if rows:
            out.append(
                f"Contention: {s['producers']} producer processes per manager, fan-out {s['fanout']:,}, "
                f"hold {s['hold_ms']:g} ms, {s['transactions']} transactions per producer per round, "
                f"up to {s['rounds']} round(s) of at most {s['round_budget_s']:g} s; multi_outlet: "
                f"{s['outlets']} outlets\n"
            )
            out.append(tables.table(rows, _CONTENTION))
            skipped = [k for k in raw.get("skipped", []) if k["db"] == db]
            out += [
                f"\n> {k['scenario']}/{k['manager']}: {k['reason']}; later rounds skipped." for k in skipped
            ]
            out += [
                f"\n> {r['scenario']}/{r['manager']}: {r['ended']} transaction(s) still open after its "
                "producers returned, ended before the next round."
                for r in rows
                if r["ended"]
            ]
            out.append("")
    out.append(tables.legend("airflow"))
    return "\n".join(out)


def errors(raw: dict[str, Any], summary: Summary) -> list[str]:
    """What makes the run fail: rows not exact (any manager), a deadlock of the plug-in."""
    found = [
        f"{r['db']} one caller F={r['fanout']}/{r['manager']}: queue rows not exact"
        for r in summary["sweep"]
        if not r["rows_exact"]
    ]
    for r in summary["contention"]:
        where = f"{r['db']} contention {r['scenario']}/{r['manager']}"
        if not r["rows_exact"]:
            found.append(f"{where}: queue or event rows not exact")
        if r["manager"] == "plugin" and r["deadlocks"]:
            found.append(f"{where}: {r['deadlocks']} deadlock(s), expected 0")
    return found
