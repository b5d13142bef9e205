"""Summaries, the Markdown tables (with their legend), JSON and PNG of the Airflow mode."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots, tables
from airflow_adrq_bench.airflow_mode.config import MANAGERS, TARGETS
from airflow_adrq_bench.stats import latency, median
from airflow_adrq_bench.tables import fmt, ratio, times

__all__ = ["errors", "format_tables", "plot", "summarize", "write_json"]

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
                **latency([r["latency_s"] * 1000 for r in measured]),
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
    return {"sweep": sweep, "contention": contention, "targets": _targets(raw, sweep, contention)}


def _targets(
    raw: dict[str, Any], sweep: Sequence[dict[str, Any]], contention: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Issue 9's targets, for what this run measured at the targets' sizes."""
    s = raw["sizes"]
    at_target_sizes = (s["producers"], s["fanout"], s["hold_ms"]) == (8, 64, 5.0)
    out = []
    for target in raw["targets"]:
        db = target["name"]
        for key, goal in TARGETS.get(db, {}).items():
            items: list[tuple[str, float]] = []
            unfinished: dict[str, str] = {}  # label -> what did not finish, instead of a ratio
            if key.startswith("F="):
                row = _find(sweep, db=db, fanout=int(key[2:]), manager="plugin")
                if row:
                    label = f"one caller, F={row['fanout']:,}: vs stock"
                    items.append((label, row["vs_stock"]))
            elif at_target_sizes:
                for scenario in raw.get("scenarios", []):
                    row = _find(contention, db=db, scenario=scenario, manager="plugin")
                    if row:
                        label = f"8 producers, {scenario}: tx/s vs sorted_loop"
                        items.append((label, row["vs_sorted_loop"]))
                        base = _find(contention, db=db, scenario=scenario, manager="sorted_loop")
                        for who, r in (("plug-in", row), ("sorted_loop", base)):
                            if r and r["abandoned"]:
                                unfinished.setdefault(label, f"{who}: {r['abandoned']} not committed")
            out += [
                {
                    "db": db,
                    "what": label,
                    "target": goal,
                    "measured": float(value),
                    "shown": unfinished.get(label),
                    # A baseline that did not finish, against a plug-in that did: met, without a ratio.
                    "met": (
                        unfinished[label].startswith("sorted_loop")
                        if label in unfinished
                        else (None if math.isnan(value) else value >= goal)
                    ),
                }
                for label, value in items
            ]
    return out


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
_TARGETS: tables.Columns = {
    "": "what",
    "target": lambda r: f">= {r['target']:g}x",
    "measured": lambda r: r.get("shown") or times(r["measured"]),
    # A second blank header (a dict needs another key): the verdict.
    " ": lambda r: "-" if r["met"] is None else ("met" if r["met"] else "NOT met"),
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
        sweep, rows, goals = (
            [r for r in summary[k] if r["db"] == db] for k in ("sweep", "contention", "targets")
        )
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
            out += [f"\n> {k['scenario']}/{k['manager']}: {k['reason']}." for k in skipped] + [""]
        if goals:
            out += ["Targets\n", tables.table(goals, _TARGETS, left=1), ""]
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


def write_json(raw: dict[str, Any], summary: Summary, path: Path) -> None:
    """The summaries plus every raw record (sweep calls, rounds with their transactions)."""
    tables.write_json(path, {"summary": summary, **raw})


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
