"""Summaries, the Markdown tables (with their legend), JSON and PNG of the Airflow mode."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots
from airflow_adrq_bench.airflow_mode.config import MANAGERS, TARGETS
from airflow_adrq_bench.stats import percentile

__all__ = [
    "LEGEND",
    "errors",
    "format_tables",
    "plot",
    "summarize",
    "write_json",
]

_FAILURES = ("deadlock", "lock_timeout", "serialization", "busy", "connection_lost")

LEGEND = """\
Legend
* Managers: `stock` = the installed Airflow's own `airflow.assets.manager.AssetManager` (the
  release in the heading); `sorted_loop` = 3.3's with each event's DAGs sorted by dag_id before
  its queue rows are written (apache/airflow PR #70128's idea, applied to 3.3.2); `plugin` =
  `airflow_adrq.airflow.AdrqAssetManager`, enabled by `AIRFLOW__CORE__ASSET_MANAGER_CLASS`. Every
  manager runs in processes of its own, configured through that option, against a scratch
  database made by `airflow db migrate`.
* One caller: `asset_manager.register_asset_change(...)` for one asset, then COMMIT, on an empty
  queue, no other activity; calls interleaved between managers. `calls`: measured calls (after one
  warm-up call each). `p50 ms` / `p95 ms`: median and 95th percentile (nearest rank) of the call
  + COMMIT. `stmts/call`: statements the call sent (cursor executes, SAVEPOINT and RELEASE
  included, BEGIN and the pool's pre-ping not; an executemany counts once per parameter set:
  stock's PostgreSQL INSERT is one, which psycopg2's execute_batch, chosen by Airflow's engine
  arguments, sends in one round trip per 2,000 rows). `x vs stock`: stock p50
  over this manager's p50 (above 1: faster than stock). `rows exact`: after every call the queue
  held exactly one row per consumer DAG.
* Contention: producer processes start together; each runs its transactions one after the other:
  `TaskInstance.register_asset_changes_in_db` (one outlet for `single`, several for
  `multi_outlet`), a hold before COMMIT (the rest of task success), COMMIT. A deadlock, lock
  timeout, serialization failure or SQLite busy error rolls the transaction back and replays it
  (jittered back-off); `gave up`: transactions not committed when the round's time budget ran
  out. `ok`: committed transactions. `deadlocks` ... `busy`: failed attempts by cause (all
  replayed). `tx/s`: committed transactions per second of round time (first producer start to
  last producer end, summed over rounds). `p50` / `p99` / `max ms`: transaction latency from the
  first BEGIN to the successful COMMIT, replays included. `stmts/tx`: median statements of the
  committed attempt. `x vs sorted_loop`: tx/s over sorted_loop's tx/s. `rows exact`: after every
  round the queue held exactly the expected (asset, consumer) rows and `asset_event` exactly one
  row per outlet of every committed transaction (none from rolled-back attempts).
* Targets (the plug-in's speed targets; reported, not asserted): one caller, plug-in against
  stock (stock p50 over plug-in p50); contention, plug-in tx/s over sorted_loop tx/s.
"""


def _ratio(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if b == 0:
        return math.inf if a > 0 else math.nan
    return a / b


def _order(raw: dict[str, Any]) -> dict[str, int]:
    return {m: i for i, m in enumerate([*raw.get("managers", []), *MANAGERS])}


def summarize(raw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Sweep rows per (db, fan-out, manager); contention rows per (db, scenario, manager); targets."""
    calls: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for record in raw["sweep"]:
        calls[(record["db"], record["fanout"], record["manager"])].append(record)
    sweep: list[dict[str, Any]] = []
    for (db, fanout, manager), records in calls.items():
        measured = [r for r in records if not r["warmup"]]
        latencies = [r["latency_s"] * 1000 for r in measured]
        sweep.append(
            {
                "db": db,
                "fanout": fanout,
                "manager": manager,
                "calls": len(measured),
                "p50_ms": percentile(latencies, 50),
                "p95_ms": percentile(latencies, 95),
                "statements": statistics.median([r["statements"] for r in measured])
                if measured
                else math.nan,
                "rows_exact": all(r["rows_exact"] for r in records),
            }
        )
    for row in sweep:
        stock = _find(sweep, db=row["db"], fanout=row["fanout"], manager="stock")
        row["vs_stock"] = _ratio(stock["p50_ms"], row["p50_ms"]) if stock else math.nan
    order = _order(raw)
    dbs = [t["name"] for t in raw["targets"]]
    sweep.sort(key=lambda r: (dbs.index(r["db"]), r["fanout"], order.get(r["manager"], 99)))

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for rnd in raw["rounds"]:
        groups[(rnd["db"], rnd["scenario"], rnd["manager"])].append(rnd)
    contention: list[dict[str, Any]] = []
    for (db, scenario, manager), rounds in groups.items():
        txs = [tx for r in rounds for tx in r["transactions"]]
        ok = [tx for tx in txs if tx["ok"]]
        latencies = [tx["latency_s"] * 1000 for tx in ok]
        duration = sum(r["duration_s"] for r in rounds)
        failures = {f: sum(tx["failures"].get(f, 0) for tx in txs) for f in _FAILURES}
        contention.append(
            {
                "db": db,
                "scenario": scenario,
                "manager": manager,
                "rounds": len(rounds),
                "committed": len(ok),
                "abandoned": len(txs) - len(ok),
                **{f"{f}s": n for f, n in failures.items()},
                "retries": sum(max(0, tx["attempts"] - 1) for tx in txs),
                "duration_s": duration,
                "tx_per_s": len(ok) / duration if duration > 0 else math.nan,
                "p50_ms": percentile(latencies, 50),
                "p99_ms": percentile(latencies, 99),
                "max_ms": max(latencies, default=math.nan),
                "statements": statistics.median([tx["statements"] for tx in ok]) if ok else math.nan,
                "rows_exact": all(r["rows_exact"] for r in rounds),
            }
        )
    for row in contention:
        base = _find(contention, db=row["db"], scenario=row["scenario"], manager="sorted_loop")
        row["vs_sorted_loop"] = _ratio(row["tx_per_s"], base["tx_per_s"]) if base else math.nan
        stock = _find(contention, db=row["db"], scenario=row["scenario"], manager="stock")
        row["vs_stock"] = _ratio(row["tx_per_s"], stock["tx_per_s"]) if stock else math.nan
    scenarios = list(raw.get("scenarios", []))
    contention.sort(
        key=lambda r: (
            dbs.index(r["db"]),
            scenarios.index(r["scenario"]) if r["scenario"] in scenarios else 99,
            order.get(r["manager"], 99),
        )
    )
    return {"sweep": sweep, "contention": contention, "targets": _targets(raw, sweep, contention)}


def _find(rows: Sequence[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _targets(
    raw: dict[str, Any], sweep: Sequence[dict[str, Any]], contention: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Issue 9's targets, for what this run measured at the targets' sizes."""
    s = raw["sizes"]
    at_target_sizes = (s["producers"], s["fanout"], s["hold_ms"]) == (8, 64, 5.0)
    out = []
    for target in raw["targets"]:
        goals = TARGETS.get(target["name"])
        if not goals:
            continue
        for key, goal in goals.items():
            items: list[tuple[str, Any]] = []
            if key.startswith("F="):
                fanout = int(key[2:])
                row = _find(sweep, db=target["name"], fanout=fanout, manager="plugin")
                if row:
                    items.append((f"one caller, fan-out {fanout:,}: plug-in vs stock", row["vs_stock"]))
            elif at_target_sizes:
                for scenario in raw.get("scenarios", []):
                    row = _find(contention, db=target["name"], scenario=scenario, manager="plugin")
                    if row:
                        label = f"8 producers, fan-out 64, hold 5 ms, {scenario}: plug-in tx/s vs sorted_loop"
                        items.append((label, row["vs_sorted_loop"]))
            for label, value in items:
                measured = float(value)
                out.append(
                    {
                        "db": target["name"],
                        "what": label,
                        "target": goal,
                        "measured": measured,
                        "met": None if math.isnan(measured) else measured >= goal,
                    }
                )
    return out


# --- text ----------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf"
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _x(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.2f}x"


def _markdown(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 2) -> str:
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in body:
        cells = [
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_tables(raw: dict[str, Any], summary: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: per database the one-caller table, the contention table, the targets; then the legend."""
    s = raw["sizes"]
    load = raw.get("load_average", {})
    loads = ", ".join(f"{k} {v[0]:.1f}" for k, v in load.items() if v)
    out = [
        f"## airflow-adrq bench --airflow: Apache Airflow {raw.get('airflow_version', '?')}, "
        f"{raw.get('cpus', '?')} CPUs" + (f" (1-minute load average: {loads})" if loads else "") + "\n"
    ]
    for target in raw["targets"]:
        db = target["name"]
        settings = ", ".join(f"{k} {v}" for k, v in target.get("settings", {}).items())
        out.append(f"### {target['version']}" + (f" ({settings})" if settings else "") + "\n")
        sweep = [r for r in summary["sweep"] if r["db"] == db]
        if sweep:
            out.append("One caller: register_asset_change + COMMIT, empty queue\n")
            body = [
                [
                    f"F={r['fanout']:,}",
                    r["manager"],
                    _fmt(r["calls"]),
                    _fmt(r["p50_ms"], 2),
                    _fmt(r["p95_ms"], 2),
                    _fmt(float(r["statements"]), 0),
                    _x(r["vs_stock"]),
                    _fmt(r["rows_exact"]),
                ]
                for r in sweep
            ]
            header = ["fan-out", "manager", "calls", "p50 ms", "p95 ms", "stmts/call", "x vs stock"]
            header.append("rows exact")
            out.append(_markdown(header, body))
            out.append("")
        rows = [r for r in summary["contention"] if r["db"] == db]
        if rows:
            out.append(
                f"Contention: {s['producers']} producer processes per manager, fan-out {s['fanout']:,}, "
                f"hold {s['hold_ms']:g} ms, {s['transactions']} transactions per producer per round, "
                f"up to {s['rounds']} round(s) of at most {s['round_budget_s']:g} s; multi_outlet: "
                f"{s['outlets']} outlets\n"
            )
            body = [
                [
                    r["scenario"],
                    r["manager"],
                    _fmt(r["committed"]),
                    _fmt(r["abandoned"]),
                    _fmt(r["deadlocks"]),
                    _fmt(r["lock_timeouts"]),
                    _fmt(r["serializations"]),
                    _fmt(r["busys"]),
                    _fmt(r["tx_per_s"]),
                    _x(r["vs_sorted_loop"]),
                    _fmt(r["p50_ms"]),
                    _fmt(r["p99_ms"]),
                    _fmt(r["max_ms"]),
                    _fmt(float(r["statements"]), 0),
                    _fmt(r["rows_exact"]),
                ]
                for r in rows
            ]
            header = [
                "scenario",
                "manager",
                "ok",
                "gave up",
                "deadlocks",
                "lock t/o",
                "serial.",
                "busy",
                "tx/s",
                "x vs sorted_loop",
                "p50 ms",
                "p99 ms",
                "max ms",
                "stmts/tx",
                "rows exact",
            ]
            out.append(_markdown(header, body))
            for skip in raw.get("skipped", []):
                if skip["db"] == db:
                    out.append(f"\n> {skip['scenario']}/{skip['manager']}: {skip['reason']}.")
            out.append("")
        goals = [r for r in summary["targets"] if r["db"] == db]
        if goals:
            out.append("Targets\n")
            body = [
                [
                    r["what"],
                    f">= {r['target']:g}x",
                    _x(r["measured"]),
                    "-" if r["met"] is None else ("met" if r["met"] else "NOT met"),
                ]
                for r in goals
            ]
            out.append(_markdown(["", "target", "measured", ""], body, left=1))
            out.append("")
    out.append(LEGEND)
    return "\n".join(out)


def errors(raw: dict[str, Any], summary: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What makes the run fail: rows not exact (any manager), a deadlock of the plug-in."""
    found = [
        f"{r['db']} one caller F={r['fanout']}/{r['manager']}: queue rows not exact"
        for r in summary["sweep"]
        if not r["rows_exact"]
    ]
    found += [
        f"{r['db']} contention {r['scenario']}/{r['manager']}: queue or event rows not exact"
        for r in summary["contention"]
        if not r["rows_exact"]
    ]
    found += [
        f"{r['db']} contention {r['scenario']}/plugin: {r['deadlocks']} deadlock(s), expected 0"
        for r in summary["contention"]
        if r["manager"] == "plugin" and r["deadlocks"]
    ]
    return found


# --- files -------------------------------------------------------------------


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(raw: dict[str, Any], summary: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """The summaries plus every raw record (sweep calls, rounds with their transactions)."""
    path.write_text(json.dumps(_clean({"summary": summary, **raw}), indent=1))


def plot(raw: dict[str, Any], summary: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[Path]:
    """One PNG per database: one-caller latency vs fan-out; contention tx/s; contention latency."""
    plt = plots.pyplot()
    paths = []
    colors = plt.get_cmap("tab10")
    order = _order(raw)
    for target in raw["targets"]:
        db = target["name"]
        sweep = [r for r in summary["sweep"] if r["db"] == db]
        rows = [r for r in summary["contention"] if r["db"] == db]
        managers = sorted({r["manager"] for r in [*sweep, *rows]}, key=lambda m: order.get(m, 99))
        color = {m: colors(i) for i, m in enumerate(managers)}
        fig, axes = plt.subplots(1, 3, figsize=(15, 5), dpi=70)

        ax = axes[0]
        for manager in managers:
            points = sorted((r["fanout"], r["p50_ms"], r["p95_ms"]) for r in sweep if r["manager"] == manager)
            if points:
                fanouts, p50, p95 = zip(*points, strict=True)
                ax.plot(fanouts, p50, marker="o", label=f"{manager} p50", color=color[manager])
                ax.plot(fanouts, p95, linestyle=":", marker=".", color=color[manager], label=f"{manager} p95")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("fan-out (consumer DAGs)")
        ax.set_title("one caller: register_asset_change + COMMIT (ms)")
        if sweep:
            ax.legend(fontsize=7)

        scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
        width = 0.8 / max(1, len(managers))
        ax = axes[1]
        for k, manager in enumerate(managers):
            cells = [_find(rows, scenario=s, manager=manager) or {} for s in scenarios]
            values = [c.get("tx_per_s", math.nan) for c in cells]
            deadlocks = [c.get("deadlocks", 0) for c in cells]
            xs = [i + (k - (len(managers) - 1) / 2) * width for i in range(len(scenarios))]
            bars = ax.bar(xs, values, width, label=manager, color=color[manager])
            ax.bar_label(bars, labels=[f"{d:,} dl" for d in deadlocks], fontsize=7)
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title("contention: committed tx/s (bar labels: deadlocks)")
        if rows:
            ax.legend(fontsize=7)

        ax = axes[2]
        for k, manager in enumerate(managers):
            for j, (key, hatch) in enumerate((("p50_ms", ""), ("p99_ms", "//"))):
                values = [
                    (_find(rows, scenario=s, manager=manager) or {}).get(key, math.nan) for s in scenarios
                ]
                offset = (k - (len(managers) - 1) / 2) * width + (j - 0.5) * width / 2
                xs = [i + offset for i in range(len(scenarios))]
                ax.bar(
                    xs,
                    values,
                    width / 2,
                    color=color[manager],
                    hatch=hatch,
                    edgecolor="white" if hatch else None,
                    label=f"{manager} {key[:3]}",
                )
        ax.set_yscale("log")
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_title("contention: transaction latency incl. replays (ms)")
        if rows:
            ax.legend(fontsize=7)

        s = raw["sizes"]
        title = (
            f"Airflow {raw.get('airflow_version', '?')} on {target['version']}: {s['producers']} producers, "
            f"fan-out {s['fanout']}, hold {s['hold_ms']:g} ms"
        )
        paths.append(plots.save(fig, title, out_dir / f"airflow-bench-{db}.png"))
    return paths
