"""Turn a run's raw records into the comparison table, a JSON file and PNG plots.

Per database, scenario and strategy: committed and abandoned transactions,
deadlocks, lock-wait timeouts, serialization failures, SQLite busy errors,
retries, throughput, latency percentiles (a transaction's latency runs from
its first BEGIN to its successful COMMIT, retries included), statements per
committed transaction and the exact-rows verdict; ratios against
``airflow_3_3`` from the same run. Plus the lost-events table ((event,
consumer) pairs no run consumed, ours against Airflow's shape), the fan-out
sweep, and the raw-SQL ratio row.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_adrq.bench.config import STRATEGIES

__all__ = [
    "SQLITE_NOTE",
    "aggregate",
    "aggregate_lost",
    "format_lost",
    "format_ratio",
    "format_sweep",
    "format_table",
    "plot",
    "write_json",
]

SQLITE_NOTE = (
    "SQLite serialises writers (one BEGIN IMMEDIATE transaction at a time), so it cannot "
    "deadlock: expect 0 deadlocks for every strategy there. The deadlock comparison needs "
    "PostgreSQL or MySQL/MariaDB."
)
_FAILURES = ("deadlock", "lock_timeout", "serialization", "busy")


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def aggregate(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary row per (database, scenario, strategy), in report order."""
    contention = [c for c in raw["cells"] if c["scenario"] != "lost_events"]
    cells = {c["index"]: c for c in contention}
    txs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for tx in raw["transactions"]:
        cell = cells.get(tx["cell"])
        if cell is not None:
            txs[(cell["db"], cell["scenario"], cell["strategy"])].append(tx)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in contention:
        groups[(cell["db"], cell["scenario"], cell["strategy"])].append(cell)
    rows = []
    for key, group in groups.items():
        db, scenario, strategy = key
        records = txs.get(key, [])
        ok = [t for t in records if t["ok"]]
        latencies = [t["latency_s"] * 1000 for t in ok]
        duration = sum(c["duration_s"] for c in group)
        failures = {f: sum(t["failures"].get(f, 0) for t in records) for f in _FAILURES}
        consumer = [c["consumer"] for c in group if c["consumer"]]
        rows.append(
            {
                "db": db,
                "scenario": scenario,
                "strategy": strategy,
                "rounds": len(group),
                "committed": len(ok),
                "abandoned": len(records) - len(ok),
                **{f"{f}s": n for f, n in failures.items()},
                "retries": sum(t["attempts"] - 1 for t in records),
                "duration_s": duration,
                "tx_per_s": len(ok) / duration if duration else math.nan,
                "p50_ms": _percentile(latencies, 50),
                "p95_ms": _percentile(latencies, 95),
                "p99_ms": _percentile(latencies, 99),
                "max_ms": max(latencies, default=math.nan),
                "statements_per_tx": statistics.median([t["statements"] for t in ok]) if ok else math.nan,
                "rows_exact": all(c["exact"] for c in group),
                "row_check": [c["check"] for c in group],
                "consumer_claims": sum(c["claims"] for c in consumer),
                "consumer_deadlocks": sum(c["failures"].get("deadlock", 0) for c in consumer),
            }
        )
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if (r["db"], r["scenario"], r["strategy"]) == (row["db"], row["scenario"], "airflow_3_3")
            ),
            None,
        )
        row["throughput_vs_airflow_3_3"] = _ratio(row["tx_per_s"], base["tx_per_s"]) if base else math.nan
        row["p99_vs_airflow_3_3"] = _ratio(row["p99_ms"], base["p99_ms"]) if base else math.nan
    order = {s: i for i, s in enumerate(STRATEGIES)}
    dbs = [t["name"] for t in raw["targets"]]
    scenarios = list(dict.fromkeys(c["scenario"] for c in contention))
    rows.sort(
        key=lambda r: (dbs.index(r["db"]), scenarios.index(r["scenario"]), order.get(r["strategy"], 99))
    )
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan


def _fmt(value: Any, digits: int = 1) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _x(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.2f}x"


_COLUMNS = (
    ("scenario", "scenario"),
    ("strategy", "strategy"),
    ("ok", "committed"),
    ("gave up", "abandoned"),
    ("deadlocks", "deadlocks"),
    ("lock t/o", "lock_timeouts"),
    ("serial.", "serializations"),
    ("busy", "busys"),
    ("retries", "retries"),
    ("tx/s", "tx_per_s"),
    ("tx/s vs 3.3", "throughput_vs_airflow_3_3"),
    ("p50 ms", "p50_ms"),
    ("p95 ms", "p95_ms"),
    ("p99 ms", "p99_ms"),
    ("max ms", "max_ms"),
    ("p99 vs 3.3", "p99_vs_airflow_3_3"),
    ("stmts/tx", "statements_per_tx"),
    ("rows exact", "rows_exact"),
)


def _cell_text(key: str, row: dict[str, Any]) -> str:
    value = row[key]
    if key.endswith("_vs_airflow_3_3"):
        return _x(value)
    if key == "rows_exact":
        return "yes" if value else "NO"
    if key == "statements_per_tx":
        return _fmt(float(value), 0)
    return _fmt(value)


def _markdown(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in body:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_table(raw: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table (Markdown), one section per database."""
    out = []
    for target in raw["targets"]:
        db_rows = [r for r in rows if r["db"] == target["name"]]
        out.append(f"### {target['name']} ({target['version']})\n")
        if target["name"].startswith("sqlite"):
            out.append(f"> {SQLITE_NOTE}\n")
        body = [[_cell_text(key, r) for _, key in _COLUMNS] for r in db_rows]
        out.append(_markdown([h for h, _ in _COLUMNS], body))
        for note in _skip_notes(raw, target["name"]):
            out.append(f"\n> {note}")
        out.append("")
    return "\n".join(out)


def aggregate_lost(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (database, hold, strategy) of the ``lost_events`` rounds.

    ``lost_pairs``: (event, consumer DAG) pairs of committed events that no
    run consumed under Airflow 3.3.2's scheduler rule; ``vs_airflow_shaped``:
    ``lost_pairs`` over ``airflow_3_3``'s at the same hold on the same
    database (target for ours: at most 0.2).
    """
    cells = [c for c in raw["cells"] if c["scenario"] == "lost_events"]
    indexes = {c["index"] for c in cells}
    failures: dict[int, Counter[str]] = defaultdict(Counter)
    committed: Counter[int] = Counter()
    latencies: dict[int, list[float]] = defaultdict(list)
    for tx in raw["transactions"]:
        if tx["cell"] in indexes:
            failures[tx["cell"]].update(tx["failures"])
            if tx["ok"]:
                committed[tx["cell"]] += 1
                latencies[tx["cell"]].append(tx["latency_s"] * 1000)
    rows = []
    for c in cells:
        rows.append(
            {
                "db": c["db"],
                "hold_ms": c["hold_ms"],
                "strategy": c["strategy"],
                "producers": c["producers"],
                "committed": committed[c["index"]],
                "events": c["events"],
                "consumers": c["consumers"],
                "pairs": c["pairs"],
                "lost_pairs": c["lost_pairs"],
                "lost_pct": 100 * c["lost_pairs"] / c["pairs"] if c["pairs"] else math.nan,
                "lost_events": c["lost_events"],
                "late_pairs": c["late_pairs"],
                "runs": c["runs"],
                "passes": c["passes"],
                "pass_p50_ms": c.get("pass_p50_ms", math.nan),
                "deadlocks": failures[c["index"]].get("deadlock", 0),
                "p50_ms": _percentile(latencies[c["index"]], 50),
                "duration_s": c["duration_s"],
                "queue_rows_left": c["queue_rows_left"],
                "consumed_unknown": c["consumed_unknown"],
            }
        )
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if (r["db"], r["hold_ms"], r["strategy"]) == (row["db"], row["hold_ms"], "airflow_3_3")
            ),
            None,
        )
        row["vs_airflow_shaped"] = (
            _ratio(float(row["lost_pairs"]), float(base["lost_pairs"])) if base else math.nan
        )
        if base and base["lost_pairs"] == 0:
            row["vs_airflow_shaped"] = 0.0 if row["lost_pairs"] == 0 else math.inf
    order = {s: i for i, s in enumerate(STRATEGIES)}
    dbs = [t["name"] for t in raw["targets"]]
    rows.sort(key=lambda r: (dbs.index(r["db"]), r["hold_ms"], order.get(r["strategy"], 99)))
    return rows


_LOST_LABEL = {"airflow_3_3": "Airflow 3.3.2 shape (airflow_3_3)", "commit_time": "ours (commit_time)"}


def format_lost(raw: dict[str, Any], lost: Sequence[dict[str, Any]]) -> str:
    """The lost-events table (Markdown), one section per database."""
    if not lost:
        return ""
    out = []
    for target in raw["targets"]:
        db_rows = [r for r in lost if r["db"] == target["name"]]
        if not db_rows:
            continue
        first = db_rows[0]
        out.append(f"### lost events, {target['name']} ({target['version']})\n")
        out.append(
            f"{first['producers']} producers of one asset, {first['consumers']} consumer DAGs, a consumer "
            "applying Airflow 3.3.2's scheduler rule (`_create_dag_runs_asset_triggered`) throughout, then "
            "a drain, then one sentinel event (committed last) and a drain again. Unconsumed: (event, "
            "consumer) pairs of committed events that no run consumed, ever (target: ours at most one "
            "fifth of Airflow's shape). Late: consumed only by the sentinel's runs (their queue row "
            "already existed with an older created_at, so the run they were queued for stopped short "
            "of them). Runs: runs the consumer created while the producers ran; passes: its scheduler "
            "loops (fewer when the producers keep the CPUs busy). p50: producer transaction latency.\n"
        )
        body = [
            [
                f"{r['hold_ms']:g}",
                _LOST_LABEL.get(r["strategy"], r["strategy"]),
                _fmt(r["events"]),
                _fmt(r["pairs"]),
                _fmt(r["lost_pairs"]),
                _fmt(r["lost_pct"]),
                _x(r["vs_airflow_shaped"]) if r["strategy"] != "airflow_3_3" else "-",
                _fmt(r["late_pairs"]),
                _fmt(r["runs"]),
                _fmt(r["passes"]),
                _fmt(r["deadlocks"]),
                _fmt(r["p50_ms"]),
            ]
            for r in db_rows
        ]
        header = [
            "hold ms",
            "producer",
            "events",
            "pairs",
            "unconsumed",
            "%",
            "vs Airflow shape",
            "late",
            "runs",
            "passes",
            "deadlocks",
            "p50 ms",
        ]
        out.append(_markdown(header, body))
        out.append("")
    return "\n".join(out)


def format_ratio(raw: dict[str, Any]) -> str:
    """The raw-SQL ratio row: ``register_asset_change`` + COMMIT against hand-written SQL."""
    out = []
    for target in raw["targets"]:
        results = raw.get("raw_sql_ratio", {}).get(target["name"], [])
        if not results:
            continue
        out.append(f"### register_asset_change vs raw SQL, {target['name']} ({target['version']})\n")
        out.append(
            f"one event + COMMIT, commit mode, against the same work in hand-written SQL through the same "
            f"driver (`engine.raw_connection()`), interleaved call by call, {results[0]['calls']} calls each "
            "on an empty queue (target: ratio at most 1.5)\n"
        )
        body = [
            [
                f"F={r['fanout']:,}",
                _fmt(r["ours_p50_ms"], 2),
                _fmt(r["ours_p95_ms"], 2),
                _fmt(r["raw_p50_ms"], 2),
                _fmt(r["raw_p95_ms"], 2),
                _x(r["ratio_p50"]),
                _x(r["ratio_p95"]),
                f"{r['ours_statements']} / {r['raw_statements']}",
                "yes" if r["rows_exact"] else "NO",
            ]
            for r in results
        ]
        header = [
            "fan-out",
            "ours p50 ms",
            "ours p95 ms",
            "raw p50 ms",
            "raw p95 ms",
            "ratio p50",
            "ratio p95",
            "stmts ours / raw",
            "rows exact",
        ]
        out.append(_markdown(header, body))
        out.append("")
    return "\n".join(out)


def format_sweep(raw: dict[str, Any]) -> str:
    """Fan-out sweep: median single-call latency (ms) and statements, per database."""
    out = []
    for target in raw["targets"]:
        results = raw["sweeps"].get(target["name"], [])
        fanouts = sorted({r["fanout"] for r in results})
        strategies = list(dict.fromkeys(r["strategy"] for r in results))
        body = []
        for strategy in strategies:
            line = [strategy]
            for fanout in fanouts:
                r = next(x for x in results if x["strategy"] == strategy and x["fanout"] == fanout)
                if "skipped" in r:
                    line.append("skipped")
                else:
                    exact = "" if r["rows_exact"] else " NOT EXACT"
                    line.append(f"{r['latency_s'] * 1000:,.1f} ms / {r['statements']:,}{exact}")
            body.append(line)
        out.append(f"### fan-out sweep, {target['name']} ({target['version']})\n")
        out.append(
            "median latency of one register_asset_change + COMMIT on an empty queue / statements sent\n"
        )
        out.append(_markdown(["strategy", *(f"F={f:,}" for f in fanouts)], body))
        for note in _skip_notes(raw, target["name"]):
            out.append(f"\n> {note}")
        out.append("")
    return "\n".join(out)


def _skip_notes(raw: dict[str, Any], db: str) -> list[str]:
    return [f"{s['strategy']}: {s['reason']}." for s in raw.get("skipped", []) if s["db"] == db]


def write_json(
    raw: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    path: Path,
    lost: Sequence[dict[str, Any]] = (),
) -> None:
    """Summary rows, lost-events rows, plus every raw record (cells, transactions, sweep, raw-SQL ratio)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    path.write_text(json.dumps(clean({"summary": list(rows), "lost_events": list(lost), **raw}), indent=1))


def plot(raw: dict[str, Any], rows: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per database: latency percentiles and deadlocks per strategy; latency vs fan-out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for target in raw["targets"]:
        db = target["name"]
        db_rows = [r for r in rows if r["db"] == db]
        scenarios = list(dict.fromkeys(r["scenario"] for r in db_rows))
        strategies = [s for s in STRATEGIES if any(r["strategy"] == s for r in db_rows)]
        lost = [r for r in aggregate_lost(raw) if r["db"] == db]
        fig = plt.figure(figsize=(15, 8), dpi=70)
        grid = fig.add_gridspec(2, max(4 if lost else 3, len(scenarios)))
        colors = plt.get_cmap("tab10")
        for i, scenario in enumerate(scenarios):
            ax = fig.add_subplot(grid[0, i])
            for j, (label, key) in enumerate((("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms"))):
                values = [_row(db_rows, scenario, s).get(key, math.nan) for s in strategies]
                ax.bar([k + (j - 1) * 0.27 for k in range(len(strategies))], values, 0.27, label=label)
            ax.set_yscale("log")
            ax.set_title(f"{scenario}: latency incl. retries (ms)")
            ax.set_xticks(range(len(strategies)), strategies, rotation=30, ha="right", fontsize=8)
            if i == 0:
                ax.legend(fontsize=8)
        ax = fig.add_subplot(grid[1, 0:2])
        width = 0.8 / max(1, len(scenarios))
        for i, scenario in enumerate(scenarios):
            values = [_row(db_rows, scenario, s).get("deadlocks", 0) for s in strategies]
            xs = [k + (i - (len(scenarios) - 1) / 2) * width for k in range(len(strategies))]
            bars = ax.bar(xs, values, width, label=scenario, color=colors(i))
            ax.bar_label(bars, fontsize=7)
        ax.set_title("deadlocks per strategy (all rounds)")
        ax.set_xticks(range(len(strategies)), strategies, fontsize=8)
        ax.legend(fontsize=8)
        ax = fig.add_subplot(grid[1, 2])
        sweep = raw["sweeps"].get(db, [])
        for k, strategy in enumerate(strategies):
            points = [
                (r["fanout"], r["latency_s"] * 1000)
                for r in sweep
                if r["strategy"] == strategy and r.get("latency_s") is not None
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=strategy, color=colors(k))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("fan-out (consumer DAGs)")
        ax.set_title("one call + COMMIT, no concurrency (ms)")
        ax.legend(fontsize=7)
        if lost:
            ax = fig.add_subplot(grid[1, 3])
            holds = sorted({r["hold_ms"] for r in lost})
            shown = [s for s in STRATEGIES if any(r["strategy"] == s for r in lost)]
            width = 0.8 / max(1, len(shown))
            for k, strategy in enumerate(shown):
                values = [
                    next((r["lost_pairs"] for r in lost if (r["hold_ms"], r["strategy"]) == (h, strategy)), 0)
                    for h in holds
                ]
                xs = [i + (k - (len(shown) - 1) / 2) * width for i in range(len(holds))]
                bars = ax.bar(xs, values, width, label=_LOST_LABEL.get(strategy, strategy))
                ax.bar_label(bars, fontsize=7)
            ax.set_xticks(range(len(holds)), [f"hold {h:g} ms" for h in holds], fontsize=8)
            ax.set_title(f"unconsumed (event, DAG) pairs of {lost[0]['pairs']}")
            ax.legend(fontsize=7)
        fig.suptitle(f"{target['version']}: {_subtitle(raw)}")
        fig.tight_layout()
        path = out_dir / f"bench-{db}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def _row(rows: Sequence[dict[str, Any]], scenario: str, strategy: str) -> dict[str, Any]:
    return next((r for r in rows if r["scenario"] == scenario and r["strategy"] == strategy), {})


def _subtitle(raw: dict[str, Any]) -> str:
    s = raw["sizes"]
    return (
        f"{s['producers']} producers x {s['transactions']} tx, fan-out {s['fanout']}, "
        f"{s['outlets']} outlets, hold {s['hold_ms']:g} ms, {s['rounds']} round(s)"
    )
