"""Turn a run's raw records into the comparison table, a JSON file and PNG plots.

Per database, scenario and strategy: planned transactions and where each
went (committed, abandoned with the reason, not started: they add up),
deadlocks, lock-wait timeouts, serialization failures, SQLite busy errors,
retries, throughput, latency percentiles (a transaction's latency runs from
its first BEGIN to its successful COMMIT, retries included), statements per
committed transaction and the exact-rows verdict; ratios against
``airflow_3_3`` from the same run. Plus the lost-events table ((event,
consumer) pairs no run consumed, ours against Airflow's shape), the fan-out
sweep, and the raw-SQL ratio row. Every kind of table is followed by a legend
of its columns and words; the default strategy (``commit_time``) is marked.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots
from airflow_adrq_bench.config import DEFAULT_STRATEGY, NOT_STARTED, SCENARIOS, STRATEGIES
from airflow_adrq_bench.stats import percentile

__all__ = [
    "LOST_LEGEND",
    "SQLITE_NOTE",
    "STRATEGY_LEGEND",
    "SWEEP_LEGEND",
    "aggregate",
    "aggregate_lost",
    "contention_legend",
    "count_errors",
    "format_lost",
    "format_ratio",
    "format_sweep",
    "format_table",
    "plot",
    "strategy_label",
    "write_json",
]

SQLITE_NOTE = (
    "SQLite serialises writers (one BEGIN IMMEDIATE transaction at a time), so it cannot "
    "deadlock: expect 0 deadlocks for every strategy there. The deadlock comparison needs "
    "PostgreSQL or MySQL/MariaDB."
)
_FAILURES = ("deadlock", "lock_timeout", "serialization", "busy")


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
        records = [t for t in txs.get(key, []) if t.get("outcome") != NOT_STARTED]
        ok = [t for t in records if t["ok"]]
        latencies = [t["latency_s"] * 1000 for t in ok]
        duration = sum(c["duration_s"] for c in group)
        failures = {f: sum(t["failures"].get(f, 0) for t in records) for f in _FAILURES}
        consumer = [c["consumer"] for c in group if c["consumer"]]
        not_started = len(txs.get(key, [])) - len(records)
        rows.append(
            {
                "db": db,
                "scenario": scenario,
                "strategy": strategy,
                "rounds": len(group),
                **_accounting(group, records, not_started),
                **{f"{f}s": n for f, n in failures.items()},
                "retries": sum(t["attempts"] - 1 for t in records),
                "duration_s": duration,
                "tx_per_s": len(ok) / duration if duration else math.nan,
                "p50_ms": percentile(latencies, 50),
                "p95_ms": percentile(latencies, 95),
                "p99_ms": percentile(latencies, 99),
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
    # Scenarios in their documented order, whatever order the rounds ran in.
    known = {s: i for i, s in enumerate(SCENARIOS)}
    scenarios = sorted({c["scenario"] for c in contention}, key=lambda s: (known.get(s, len(known)), s))
    rows.sort(
        key=lambda r: (dbs.index(r["db"]), scenarios.index(r["scenario"]), order.get(r["strategy"], 99))
    )
    return rows


def _accounting(
    cells: Sequence[dict[str, Any]], started: Sequence[dict[str, Any]], not_started: int
) -> dict[str, Any]:
    """Planned transactions and where each went: committed, abandoned (gave up, and why), not started.

    ``planned`` comes from the coordinator's cell records (records without
    it: what the producers recorded). ``accounted``: the three add up to it.
    """
    committed = sum(1 for t in started if t["ok"])
    recorded = len(started) + not_started
    planned = sum(c["planned"] for c in cells) if all("planned" in c for c in cells) else recorded
    why = Counter(_why(t) for t in started if not t["ok"])
    return {
        "planned": planned,
        "committed": committed,
        "abandoned": len(started) - committed,
        "not_started": not_started,
        "gave_up_why": dict(sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))),
        "accounted": committed + (len(started) - committed) + not_started == planned,
    }


def _why(tx: dict[str, Any]) -> str:
    reason = tx.get("gave_up") or "gave up"
    last = tx.get("last_failure")
    return f"{reason} (last error: {_FAILURE_WORDS.get(last, last)})" if last else reason


_FAILURE_WORDS = {
    "deadlock": "deadlock",
    "lock_timeout": "lock timeout",
    "serialization": "serialization failure",
    "busy": "SQLite busy",
}


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
    ("planned", "planned"),
    ("ok", "committed"),
    ("gave up", "abandoned"),
    ("not started", "not_started"),
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


def strategy_label(strategy: str) -> str:
    """The strategy's name in the tables, the default one marked."""
    return f"{strategy} (default)" if strategy == DEFAULT_STRATEGY else strategy


def _cell_text(key: str, row: dict[str, Any]) -> str:
    value = row[key]
    if key == "strategy":
        return strategy_label(value)
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


def _row_notes(row: dict[str, Any], label: str) -> list[str]:
    """The notes under a table for its row ``label``: why transactions gave up, counts that do not add up."""
    notes = []
    if row.get("gave_up_why"):
        why = "; ".join(f"{n} {reason}" for reason, n in row["gave_up_why"].items())
        notes.append(f"\n> gave up, {label}: {why}")
    if not row.get("accounted", True):
        notes.append(
            f"\n> COUNTS DO NOT ADD UP, {label}: {row['committed']} ok + {row['abandoned']} gave up + "
            f"{row['not_started']} not started != {row['planned']} planned"
        )
    return notes


def format_table(raw: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The comparison table (Markdown), one section per database, then its legend."""
    out = []
    for target in raw["targets"]:
        db_rows = [r for r in rows if r["db"] == target["name"]]
        if not db_rows:
            continue
        out.append(f"### {target['name']} ({target['version']})\n")
        if target["name"].startswith("sqlite"):
            out.append(f"> {SQLITE_NOTE}\n")
        body = [[_cell_text(key, r) for _, key in _COLUMNS] for r in db_rows]
        out.append(_markdown([h for h, _ in _COLUMNS], body))
        for r in db_rows:
            out += _row_notes(r, f"{r['scenario']}/{r['strategy']}")
        for note in _skip_notes(raw, target["name"]):
            out.append(f"\n> {note}")
        out.append("")
    if out:
        out.append(contention_legend(raw.get("sizes", {})))
    return "\n".join(out)


#: What every strategy name means (legends of the contention and sweep tables).
STRATEGY_LEGEND = (
    "* strategy: how a transaction's queue rows are written; every strategy runs the whole "
    "register_asset_change (asset lookup, asset_event row, consumer DAGs, queue rows) once per emitted "
    "asset. Baselines, copies of Airflow's code kept for comparison: `airflow_3_3` = Airflow 3.3.2 as "
    "released (a queue row per consumer DAG, in Python-set order); `sorted_loop` = the same with each "
    "event's DAGs sorted by dag_id (apache/airflow PR #70128, unmerged); `values_batch` = one multi-row "
    "INSERT per event (PR #69977; MySQL/MariaDB only). Ours, airflow_adrq.register_asset_change: "
    '`per_call` = queue_mode="immediate", one ordered INSERT ... SELECT per call, i.e. per emitted '
    'asset; `commit_time (default)` = the default queue_mode="commit" (and what the Airflow plug-in '
    "does): one ordered INSERT ... SELECT for all the transaction's events, just before COMMIT.\n"
    "* Why `per_call` can deadlock and `commit_time` cannot: per_call locks an asset's queue rows when "
    "that asset is emitted, so a transaction emitting A then B holds A's rows while it waits for B's, "
    "and one emitting B then A the reverse: a cycle (multi_outlet, with_consumer). commit_time takes "
    "all of a transaction's queue-row locks in one statement, in (asset_id, dag_id) order, the same "
    "order in every transaction: no cycle. With one asset per transaction (single) both are one "
    "ordered statement."
)

STATEMENTS_RULE = (
    "statements are counted as the driver is asked to run them: every cursor execute, SAVEPOINT and "
    "RELEASE included, BEGIN not, an executemany once"
)


def contention_legend(sizes: dict[str, Any]) -> str:
    """The legend under the contention tables (sizes: the run's, for the numbers it quotes)."""

    def size(name: str, unit: str = "") -> str:
        value = sizes.get(name)
        return f"`{name}`" if value is None else f"{value:g}{unit}"

    return (
        "Legend (contention tables). Each round, "
        f"{size('producers')} producer processes start together and each runs {size('transactions')} "
        "producer transactions one after another: the strategy's queueing for each emitted asset, a "
        f"hold of {size('hold_ms', ' ms')} (the rest of task success), COMMIT; "
        f"{size('rounds')} round(s) per row.\n"
        "* scenario: `single` = every transaction emits the same asset; `multi_outlet` = each emits "
        f"{size('outlets')} assets in random order; `with_consumer` = multi_outlet while a scheduler-like "
        "process claims and deletes queue rows (FOR UPDATE SKIP LOCKED).\n"
        f"{STRATEGY_LEGEND}\n"
        "* planned: producers x transactions x rounds. ok: committed (retries included). gave up: "
        f"started, never committed: {size('max_attempts')} attempts used up, or a retryable failure "
        f"after the round timeout ({size('round_timeout_s', ' s')}); why: under the table. not started: "
        "not begun, the round timeout had passed. ok + gave up + not started = planned.\n"
        "* deadlocks, lock t/o, serial., busy: failed attempts by cause (a deadlock the server broke; "
        f"a lock wait over {size('lock_timeout_s', ' s')}; a serialization failure; SQLite busy), each "
        "rolled back and retried from BEGIN. retries: attempts after the first.\n"
        "* tx/s: committed transactions per second of round time. tx/s vs 3.3, p99 vs 3.3: ratio to "
        "`airflow_3_3` in the same scenario (higher tx/s, lower p99 is better).\n"
        "* p50 / p95 / p99 / max ms: latency of the committed transactions from their first BEGIN to "
        "the COMMIT that succeeded: retries, back-off and hold included (nearest rank).\n"
        f"* stmts/tx: median statements of a committed transaction's last attempt ({STATEMENTS_RULE}).\n"
        "* rows exact: after every round the queue held exactly one row per (asset, unpaused consumer "
        "DAG) of the committed transactions, less those the consumer claimed; none for paused DAGs or "
        "rolled-back attempts.\n"
    )


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
    started: dict[int, list[dict[str, Any]]] = defaultdict(list)
    not_started: Counter[int] = Counter()
    latencies: dict[int, list[float]] = defaultdict(list)
    for tx in raw["transactions"]:
        if tx["cell"] in indexes:
            if tx.get("outcome") == NOT_STARTED:
                not_started[tx["cell"]] += 1
                continue
            started[tx["cell"]].append(tx)
            failures[tx["cell"]].update(tx["failures"])
            if tx["ok"]:
                latencies[tx["cell"]].append(tx["latency_s"] * 1000)
    rows = []
    for c in cells:
        rows.append(
            {
                "db": c["db"],
                "hold_ms": c["hold_ms"],
                "strategy": c["strategy"],
                "producers": c["producers"],
                **_accounting([c], started[c["index"]], not_started[c["index"]]),
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
                "p50_ms": percentile(latencies[c["index"]], 50),
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


_LOST_LABEL = {
    "airflow_3_3": "Airflow 3.3.2 shape (airflow_3_3)",
    "commit_time": "ours (commit_time) (default)",
}

LOST_LEGEND = (
    "Legend (lost events). Producers of one asset (one event per transaction) run while a consumer "
    "applies Airflow 3.3.2's scheduler rule (`_create_dag_runs_asset_triggered`): per consumer DAG it "
    "takes the queue rows, and the run consumes the DAG's events up to the newest row's created_at. "
    "After the producers: a drain, one sentinel event (committed last), a drain again.\n"
    "* hold ms: how long each producer transaction stays open after queueing, before COMMIT. producer: "
    "`airflow_3_3` = Airflow 3.3.2's register_asset_change; `ours (commit_time) (default)` = "
    "airflow_adrq.register_asset_change as it is by default (events and queue rows stamped together "
    "just before COMMIT).\n"
    "* planned, events, gave up, not started: producer transactions planned, committed (one event "
    "each), started but never committed, not begun before the round's timeout; they add up to planned.\n"
    "* pairs: events x consumer DAGs. unconsumed: (event, consumer DAG) pairs of committed events that "
    "no run consumed, ever (the event's timestamp fell in a run's window, but the event was committed "
    "only after that run had read the events, and later runs start after it); %: of pairs; vs "
    "Airflow shape: unconsumed over airflow_3_3's at the same hold (target for ours: at most 0.2x).\n"
    "* late: pairs consumed only by the sentinel's runs: their queue row already existed with an older "
    "created_at, so the run it triggered stopped short of them; they wait for the DAG's next event.\n"
    "* runs: runs the consumer created while the producers ran; passes: its scheduler loops (fewer when "
    "the producers keep the CPUs busy). deadlocks: failed producer attempts (retried). p50 ms: median "
    "latency of the committed producer transactions, retries and hold included.\n"
)


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
        out.append(f"{first['producers']} producers of one asset, {first['consumers']} consumer DAGs\n")
        body = [
            [
                f"{r['hold_ms']:g}",
                _LOST_LABEL.get(r["strategy"], r["strategy"]),
                _fmt(r["planned"]),
                _fmt(r["events"]),
                _fmt(r["abandoned"]),
                _fmt(r["not_started"]),
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
            "planned",
            "events",
            "gave up",
            "not started",
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
        for r in db_rows:
            out += _row_notes(r, f"hold {r['hold_ms']:g} ms {r['strategy']}")
        out.append("")
    if out:
        out.append(LOST_LEGEND)
    return "\n".join(out)


def format_ratio(raw: dict[str, Any]) -> str:
    """The raw-SQL ratio row: ``register_asset_change`` + COMMIT against hand-written SQL."""
    out = []
    for target in raw["targets"]:
        results = raw.get("raw_sql_ratio", {}).get(target["name"], [])
        if not results:
            continue
        out.append(f"### register_asset_change vs raw SQL, {target['name']} ({target['version']})\n")
        out.append(f"{results[0]['calls']} calls each side per fan-out\n")
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
    if out:
        out.append(_RATIO_LEGEND.format(rule=STATEMENTS_RULE))
    return "\n".join(out)


_RATIO_LEGEND = (
    "Legend (raw SQL). One caller registers one event and commits, on an empty queue: ours = "
    "`register_asset_change(asset=..., session=s); s.commit()` (commit_time, the default), raw = the "
    "same work (lookup, event, queue rows, COMMIT) in hand-written SQL through the same driver "
    "(`engine.raw_connection()`), calls interleaved in random order, after one untimed call each.\n"
    "* fan-out: consumer DAGs of the asset (queue rows per call). ours / raw p50, p95 ms: median and "
    "95th percentile (nearest rank) per call + COMMIT.\n"
    "* ratio p50, ratio p95: ours over raw (1.00x = no overhead; target: at most 1.5x).\n"
    "* stmts ours / raw: statements per call; ours counted ({rule}), raw the fixed count of the "
    "hand-written side. rows exact: after every call the queue held one row per consumer DAG.\n"
)


SWEEP_LEGEND = (
    "Legend (fan-out sweep). One caller, no concurrency: one register_asset_change for one asset + "
    "COMMIT on an empty queue, per strategy (names as in the contention legend; `(default)` marks "
    "commit_time, what register_asset_change does by default).\n"
    "* F=N: the asset has N consumer DAGs. Each cell: median latency of {repeats} timed call(s) after "
    "one warm-up call / statements the call sent ({rule}). skipped: projected from the previous "
    "fan-out to take over 20 s. NOT EXACT: the queue did not hold one row per consumer DAG.\n"
)


def format_sweep(raw: dict[str, Any]) -> str:
    """Fan-out sweep: median single-call latency (ms) and statements, per database."""
    out = []
    for target in raw["targets"]:
        results = raw["sweeps"].get(target["name"], [])
        fanouts = sorted({r["fanout"] for r in results})
        order = {s: i for i, s in enumerate(STRATEGIES)}
        strategies = sorted(dict.fromkeys(r["strategy"] for r in results), key=lambda s: order.get(s, 99))
        body = []
        for strategy in strategies:
            line = [strategy_label(strategy)]
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
    if out:
        repeats = raw.get("sizes", {}).get("sweep_repeats", "sweep_repeats")
        out.append(SWEEP_LEGEND.format(repeats=repeats, rule=STATEMENTS_RULE))
    return "\n".join(out)


def _skip_notes(raw: dict[str, Any], db: str) -> list[str]:
    return [f"{s['strategy']}: {s['reason']}." for s in raw.get("skipped", []) if s["db"] == db]


def count_errors(rows: Sequence[dict[str, Any]], lost: Sequence[dict[str, Any]] = ()) -> list[str]:
    """One message per summary row whose committed + gave up + not started is not its planned count."""
    errors = []
    for r in [*rows, *lost]:
        if r.get("accounted", True):
            continue
        where = r.get("scenario") or f"lost_events hold {r['hold_ms']:g} ms"
        errors.append(
            f"{r['db']} {where}/{r['strategy']}: {r['committed']} committed + {r['abandoned']} gave up + "
            f"{r['not_started']} not started != {r['planned']} planned transactions"
        )
    return errors


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
    plt = plots.pyplot()
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
        paths.append(plots.save(fig, f"{target['version']}: {_subtitle(raw)}", out_dir / f"bench-{db}.png"))
    return paths


def _row(rows: Sequence[dict[str, Any]], scenario: str, strategy: str) -> dict[str, Any]:
    return next((r for r in rows if r["scenario"] == scenario and r["strategy"] == strategy), {})


def _subtitle(raw: dict[str, Any]) -> str:
    s = raw["sizes"]
    return (
        f"{s['producers']} producers x {s['transactions']} tx, fan-out {s['fanout']}, "
        f"{s['outlets']} outlets, hold {s['hold_ms']:g} ms, {s['rounds']} round(s)"
    )
