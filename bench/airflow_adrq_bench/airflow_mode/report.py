"""Summaries, the verdict, the Markdown tables (with their legend), JSON and PNG of the Airflow mode.

The verdict's targets are defined here, once (:data:`SPEED_GOALS`, and the shared
:mod:`airflow_adrq_bench.verdict` targets for deadlocks, transactions not
committed and exact rows); :func:`verdict` judges a run against them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots, tables
from airflow_adrq_bench.airflow_mode.config import MANAGERS
from airflow_adrq_bench.stats import latency, median, percentile
from airflow_adrq_bench.tables import fmt, ratio, times
from airflow_adrq_bench.verdict import DEADLOCKS, NOT_COMMITTED, ROWS_EXACT, Line, Target

__all__ = ["SPEED_GOALS", "errors", "format_tables", "plot", "summarize", "verdict", "write_json"]

#: The plug-in's speed targets per database: one caller at fan-out F against stock (stock p50
#: over the plug-in's p50), and 8 producers' committed tx/s against sorted_loop's
#: (``contention``, judged at the default contention sizes only).
SPEED_GOALS: dict[str, dict[str, float]] = {
    "postgresql": {"F=1": 1.0, "F=64": 2.5, "F=1024": 4.0, "contention": 2.0},
    "mariadb": {"F=1": 1.0, "F=64": 20.0, "F=1024": 100.0, "contention": 15.0},
}

_FAILURES = ("deadlock", "lock_timeout", "serialization", "busy", "connection_lost")
Summary = dict[str, list[dict[str, Any]]]


def _find(rows: Sequence[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The first row with every ``match`` (empty if none)."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), {})


def _grouped(records: Sequence[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[tuple(record[k] for k in keys)].append(record)
    return groups


def _order(raw: dict[str, Any]) -> dict[str, int]:
    """Managers in the order asked for, then the known ones."""
    return {m: i for i, m in enumerate([*raw.get("managers", []), *MANAGERS])}


def _sort(raw: dict[str, Any], rows: list[dict[str, Any]], by: Callable[[dict[str, Any]], Any]) -> None:
    """Databases in run order, then ``by``, then managers."""
    dbs, order = [t["name"] for t in raw["targets"]], _order(raw)
    rows.sort(key=lambda r: (dbs.index(r["db"]), by(r), order.get(r["manager"], 99)))


def summarize(raw: dict[str, Any]) -> Summary:
    """Sweep rows per (db, fan-out, manager); contention rows per (db, scenario, manager); targets."""
    sweep = []
    for (db, fanout, manager), records in _grouped(raw["sweep"], "db", "fanout", "manager").items():
        measured = [r for r in records if not r["warmup"]]
        sweep.append(
            {
                "db": db,
                "fanout": fanout,
                "manager": manager,
                "calls": len(measured),
                **latency(ms := [r["latency_s"] * 1000 for r in measured]),
                "p25_ms": percentile(ms, 25),
                "p75_ms": percentile(ms, 75),
                "statements": median([r["statements"] for r in measured]),
                "rows_exact": all(r["rows_exact"] for r in records),
            }
        )
    for row in sweep:
        stock = _find(sweep, db=row["db"], fanout=row["fanout"], manager="stock")
        row["vs_stock"] = ratio(stock.get("p50_ms", math.nan), row["p50_ms"])
    _sort(raw, sweep, lambda r: r["fanout"])

    contention = []
    for (db, scenario, manager), rounds in _grouped(raw["rounds"], "db", "scenario", "manager").items():
        txs = [tx for r in rounds for tx in r["transactions"]]
        ok = [tx for tx in txs if tx["ok"]]
        duration = sum(r["duration_s"] for r in rounds)
        contention.append(
            {
                "db": db,
                "scenario": scenario,
                "manager": manager,
                "rounds": len(rounds),
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
            }
        )
    for row in contention:
        for base in ("sorted_loop", "stock"):
            other = _find(contention, db=row["db"], scenario=row["scenario"], manager=base)
            # No ratio over a side that did not finish its transactions: it would measure the budget.
            finished = not other.get("abandoned") and not row["abandoned"]
            theirs = other.get("tx_per_s", math.nan) if finished else math.nan
            row[f"vs_{base}"] = ratio(row["tx_per_s"], theirs)
    scenarios = list(raw.get("scenarios", []))
    _sort(raw, contention, lambda r: scenarios.index(r["scenario"]) if r["scenario"] in scenarios else 99)
    return {"sweep": sweep, "contention": contention}


def verdict(raw: dict[str, Any], summary: Summary) -> list[Line]:
    """Per database: the plug-in's deadlocks, transactions not committed and exact rows, then its speed
    against stock (one caller) and sorted_loop (contention), each judged against its target."""
    s = raw["sizes"]
    # The contention goal is about 8 producers at fan-out 64 with a 5 ms hold: judged at those sizes only.
    at_goal_sizes = (s["producers"], s["fanout"], s["hold_ms"]) == (8, 64, 5.0)
    lines = []
    for db in [t["name"] for t in raw["targets"]]:
        sweep = [r for r in summary["sweep"] if r["db"] == db]
        rows = [r for r in summary["contention"] if r["db"] == db]
        ours = [r for r in rows if r["manager"] == "plugin"]
        if ours:
            deadlocks = sum(r["deadlocks"] for r in ours)
            lines.append(_judge(db, DEADLOCKS, deadlocks, f"{deadlocks}"))
            failed, planned = (
                sum(r["abandoned"] for r in ours),
                sum(r["committed"] + r["abandoned"] for r in ours),
            )
            lines.append(_judge(db, NOT_COMMITTED, failed, f"{failed} of {planned}"))
        exact = all(r["rows_exact"] for r in [*sweep, *rows] if r["manager"] == "plugin")
        if sweep or ours:
            lines.append(_judge(db, ROWS_EXACT, float(exact), "all" if exact else "NOT all"))
        goals = SPEED_GOALS.get(db, {})
        for key, goal in goals.items():
            if key.startswith("F="):
                fanout = int(key[2:])
                mine = _find(sweep, fanout=fanout, manager="plugin")
                stock = _find(sweep, fanout=fanout, manager="stock")
                if mine and stock:
                    # The spread: the ratio's range over the two sides' interquartile ranges.
                    spread = (stock["p25_ms"] / mine["p75_ms"], stock["p75_ms"] / mine["p25_ms"])
                    what = f"one caller F={fanout:,}: p50 vs stock"
                    lines.append(_speed(db, what, goal, mine["vs_stock"], spread, "IQR"))
        for scenario in raw.get("scenarios", []) if "contention" in goals and at_goal_sizes else []:
            mine = _find(ours, scenario=scenario)
            base = _find(rows, scenario=scenario, manager="sorted_loop")
            if not mine or not base:
                continue
            what = f"8 producers {scenario}: tx/s vs sorted"
            unfinished = [(who, r) for who, r in (("plug-in", mine), ("sorted_loop", base)) if r["abandoned"]]
            if unfinished:
                # A ratio would measure the round's time budget, not speed: say what did not finish.
                who, r = unfinished[0]
                shown = f"{who}: {r['abandoned']} of {r['committed'] + r['abandoned']} not committed"
                lines.append(
                    Line(db, what, f">= {goal:g}x", shown, "met" if who == "sorted_loop" else "MISSED")
                )
                continue
            theirs = base["round_tx_per_s"]
            spread = (min(mine["round_tx_per_s"]) / max(theirs), max(mine["round_tx_per_s"]) / min(theirs))
            rounds = f"{len(theirs)} rounds" if len(theirs) > 1 else "1 round"
            lines.append(_speed(db, what, goal, mine["vs_sorted_loop"], spread, rounds))
    return lines


def _judge(db: str, target: Target, value: float, shown: str) -> Line:
    return Line(db, target.what, target.goal, shown, "met" if target.met(value) else "MISSED")


def _speed(db: str, what: str, goal: float, value: float, spread: tuple[float, float], of: str) -> Line:
    """A timed ratio with its spread; where the spread holds 1 the sides overlap: no winner, and a goal
    of "not slower" (1x) is met."""
    low, high = spread
    overlap = low <= 1 <= high
    shown = f"{value:.2f}x ({of} {low:.2f}-{high:.2f})" if low != high else f"{value:.2f}x ({of})"
    met = value >= goal or (overlap and goal <= 1)
    return Line(
        db, what, f">= {goal:g}x", shown + (", overlap" if overlap else ""), "met" if met else "MISSED"
    )


_SWEEP: tables.Columns = {
    "fan-out": lambda r: f"F={r['fanout']:,}",
    "manager": "manager",
    "calls": "calls",
    "p50 ms": lambda r: fmt(r["p50_ms"], 2),
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
    """Markdown: per database the one-caller table, the contention table, the targets; then the legend."""
    s = raw["sizes"]
    loads = ", ".join(f"{k} {v[0]:.1f}" for k, v in raw.get("load_average", {}).items() if v)
    out = [
        f"## airflow-adrq bench --airflow: Apache Airflow {raw.get('airflow_version', '?')}, "
        f"{raw.get('cpus', '?')} CPUs" + (f" (1-minute load average: {loads})" if loads else "") + "\n"
    ]
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


def write_json(raw: dict[str, Any], summary: Summary, path: Path, lines: Sequence[Line]) -> None:
    """The verdict, the summaries and every raw record (sweep calls, rounds with their transactions)."""
    tables.write_json(path, {"verdict": [dataclasses.asdict(ln) for ln in lines], "summary": summary, **raw})


def plot(raw: dict[str, Any], summary: Summary, out_dir: Path) -> list[Path]:
    """One PNG per database: one-caller latency vs fan-out; contention tx/s; contention latency."""
    plt = plots.pyplot()
    colors = plt.get_cmap("tab10")
    paths = []
    for target in raw["targets"]:
        db = target["name"]
        sweep = [r for r in summary["sweep"] if r["db"] == db]
        rows = [r for r in summary["contention"] if r["db"] == db]
        managers = sorted({r["manager"] for r in [*sweep, *rows]}, key=lambda m: _order(raw).get(m, 99))
        color = {m: colors(i) for i, m in enumerate(managers)}
        fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 5), dpi=70)

        for manager in managers:
            points = sorted((r["fanout"], r["p50_ms"], r["p95_ms"]) for r in sweep if r["manager"] == manager)
            if points:
                fanouts, p50, p95 = zip(*points, strict=True)
                style = {"color": color[manager]}
                left.plot(fanouts, p50, marker="o", label=f"{manager} p50", **style)
                left.plot(fanouts, p95, linestyle=":", marker=".", label=f"{manager} p95", **style)
        left.set(xscale="log", yscale="log", xlabel="fan-out (consumer DAGs)")
        left.set_title("one caller: register_asset_change + COMMIT (ms)")

        scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
        cells = {m: [_find(rows, scenario=s, manager=m) for s in scenarios] for m in managers}
        series: list[plots.Series] = [
            (m, [c.get("tx_per_s", math.nan) for c in cells[m]], {"color": color[m]}) for m in managers
        ]
        for bars, manager in zip(plots.bars(middle, scenarios, series), managers, strict=True):
            deadlocks = [c.get("deadlocks", 0) for c in cells[manager]]
            middle.bar_label(bars, labels=[f"{d:,} dl" for d in deadlocks], fontsize=7)
        middle.set_title("contention: committed tx/s (bar labels: deadlocks)")

        series = [
            (f"{m} {key[:3]}", [c.get(key, math.nan) for c in cells[m]], style)
            for m in managers
            for key, style in (
                ("p50_ms", {"color": color[m]}),
                ("p99_ms", {"color": color[m], "hatch": "//", "edgecolor": "white"}),
            )
        ]
        plots.bars(right, scenarios, series)
        right.set(yscale="log", title="contention: transaction latency incl. replays (ms)")
        for ax, shown in ((left, sweep), (middle, rows), (right, rows)):
            if shown:
                ax.legend(fontsize=7)
        s = raw["sizes"]
        title = (
            f"Airflow {raw.get('airflow_version', '?')} on {target['version']}: {s['producers']} producers, "
            f"fan-out {s['fanout']}, hold {s['hold_ms']:g} ms"
        )
        paths.append(plots.save(fig, title, out_dir / f"airflow-bench-{db}.png"))
    return paths
