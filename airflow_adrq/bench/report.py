"""Turn a run's raw records into the comparison table, a JSON file and PNG plots.

Per database, scenario and strategy: committed and abandoned transactions,
deadlocks, lock-wait timeouts, serialization failures, SQLite busy errors,
retries, throughput, latency percentiles (a transaction's latency runs from
its first BEGIN to its successful COMMIT, retries included), statements per
committed transaction and the exact-rows verdict; ratios against
``airflow_3_3`` from the same run. Plus the fan-out sweep.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_adrq.bench.config import STRATEGIES

__all__ = ["SQLITE_NOTE", "aggregate", "format_sweep", "format_table", "plot", "write_json"]

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
    cells = {c["index"]: c for c in raw["cells"]}
    txs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for tx in raw["transactions"]:
        cell = cells.get(tx["cell"])
        if cell is not None:
            txs[(cell["db"], cell["scenario"], cell["strategy"])].append(tx)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for cell in raw["cells"]:
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
    scenarios = list(dict.fromkeys(c["scenario"] for c in raw["cells"]))
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
    return "-" if math.isnan(value) else f"{value:.2f}x"


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
        out.append("median latency of one queue call + COMMIT on an empty queue / statements sent\n")
        out.append(_markdown(["strategy", *(f"F={f:,}" for f in fanouts)], body))
        out.append("")
    return "\n".join(out)


def write_json(raw: dict[str, Any], rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Summary rows plus every raw record (cells, transactions, sweep)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    path.write_text(json.dumps(clean({"summary": list(rows), **raw}), indent=1))


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
        fig = plt.figure(figsize=(15, 8), dpi=70)
        grid = fig.add_gridspec(2, max(3, len(scenarios)))
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
