"""The standalone run's report: raw records into summary rows, Markdown tables, CSV, JSON and PNG plots.

Per database: the contention tables (per scenario and strategy), the lost-events table, the fan-out sweep
and the raw-SQL ratio, each with its legend; every Markdown table fits 100 columns, and the columns that
do not fit beside them are in the CSV files (:func:`write_csv`).
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_adrq_bench import tables, verdict
from airflow_adrq_bench.config import DEFAULT_STRATEGY, SCENARIOS, STRATEGIES
from airflow_adrq_bench.stats import latency, median
from airflow_adrq_bench.tables import fmt, times
from airflow_adrq_bench.verdict import Row, Rows
from airflow_adrq_testing.transactions import NOT_STARTED

SQLITE_NOTE = (
    "SQLite serialises writers (one BEGIN IMMEDIATE transaction at a time), so it cannot deadlock: expect 0 "
    "deadlocks for every strategy there. The deadlock comparison needs PostgreSQL or MySQL/MariaDB."
)

LOST_LEGEND = tables.legend("lost", target=verdict.LOST.goal)
#: Failed attempts by cause: the JSON's key (plus ``s``) and the words of "gave up" notes.
_FAILURES = {
    "deadlock": "deadlock",
    "lock_timeout": "lock timeout",
    "serialization": "serialization failure",
    "busy": "SQLite busy",
}
_ORDER = {s: i for i, s in enumerate(STRATEGIES)}
#: The lost-events table's and plot's names of its two producers.
_PRODUCERS = {
    "airflow_3_3": "Airflow 3.3.2 shape (airflow_3_3)",
    "commit_time": "ours (commit_time) (default)",
}


def _by_cell(raw: Row) -> dict[int, list[Row]]:
    """The run's transaction records by cell index, read once per aggregate."""
    by_cell: dict[int, list[Row]] = defaultdict(list)
    for tx in raw["transactions"]:
        by_cell[tx["cell"]].append(tx)
    return by_cell


def _outcome(cells: Rows, by_cell: dict[int, list[Row]]) -> Row:
    """Where the cells' planned transactions went (``accounted``: they add up to ``planned``), their
    failed attempts by cause, retries, latency; a not-started transaction made no attempt."""
    txs = [t for c in cells for t in by_cell[c["index"]]]
    started = [t for t in txs if t.get("outcome") != NOT_STARTED]
    ok = [t for t in started if t["ok"]]
    planned = sum(c["planned"] for c in cells) if all("planned" in c for c in cells) else len(txs)
    why = Counter(_why(t) for t in started if not t["ok"])
    return {
        "planned": planned,
        "committed": len(ok),
        "abandoned": len(started) - len(ok),
        "not_started": len(txs) - len(started),
        "gave_up_why": dict(sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))),
        "accounted": len(txs) == planned,
        **{f"{f}s": sum(t["failures"].get(f, 0) for t in started) for f in _FAILURES},
        "retries": sum(t["attempts"] - 1 for t in started),
        **latency([t["latency_s"] * 1000 for t in ok]),
        "statements_per_tx": median([t["statements"] for t in ok]),
    }


def _why(tx: Row) -> str:
    """Why a transaction gave up, with its last error."""
    reason = tx.get("gave_up") or "gave up"
    last = tx.get("last_failure")
    return f"{reason} (last error: {_FAILURES.get(last, last)})" if last else reason


def _baseline(rows: Rows, row: Row, by: str) -> Row:
    """``airflow_3_3``'s row on ``row``'s database with the same ``by`` (empty if it did not run)."""
    same = (r for r in rows if (r["db"], r[by], r["strategy"]) == (row["db"], row[by], "airflow_3_3"))
    return next(same, {})


def _in_order(raw: Row, rows: list[Row], by: Callable[[Row], Any]) -> None:
    """Sort ``rows`` by database (as run), ``by``, then strategy (as :data:`STRATEGIES` lists them)."""
    dbs = [t["name"] for t in raw["targets"]]
    rows.sort(key=lambda r: (dbs.index(r["db"]), by(r), _ORDER.get(r["strategy"], 99)))


def aggregate(raw: Row) -> list[Row]:
    """One summary row per (database, scenario, strategy), in report order."""
    by_cell = _by_cell(raw)
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for cell in raw["cells"]:
        if cell["scenario"] != "lost_events":
            groups[(cell["db"], cell["scenario"], cell["strategy"])].append(cell)
    rows = []
    for cells in groups.values():
        outcome = _outcome(cells, by_cell)
        duration = sum(c["duration_s"] for c in cells)
        consumer = [c["consumer"] for c in cells if c["consumer"]]
        rows.append(
            {
                **{key: cells[0][key] for key in ("db", "scenario", "strategy")},
                "rounds": len(cells),
                **outcome,
                "duration_s": duration,
                "tx_per_s": outcome["committed"] / duration if duration else math.nan,
                # Each round's own, the spread of tx/s the verdict compares.
                "round_tx_per_s": [
                    sum(t["ok"] for t in by_cell[c["index"]]) / c["duration_s"]
                    for c in cells
                    if c["duration_s"]
                ],
                "rows_exact": all(c["exact"] for c in cells),
                "row_check": [c["check"] for c in cells],
                "consumer_claims": sum(c["claims"] for c in consumer),
                "consumer_deadlocks": sum(c["failures"].get("deadlock", 0) for c in consumer),
            }
        )
    for row in rows:
        base = _baseline(rows, row, "scenario")
        # No ratio where a side left transactions unfinished (it would measure the round's time budget)
        # or deadlocked (PostgreSQL's deadlock_timeout): as the verdict says it.
        finished = base and not any(r["abandoned"] + r["not_started"] + r["deadlocks"] for r in (row, base))
        for key, name in (("tx_per_s", "throughput_vs_airflow_3_3"), ("p99_ms", "p99_vs_airflow_3_3")):
            row[name] = tables.ratio(row[key], base[key]) if finished else math.nan
    # Scenarios in their documented order, whatever order the rounds ran in.
    known = {s: i for i, s in enumerate(SCENARIOS)}
    _in_order(raw, rows, lambda r: (known.get(r["scenario"], len(known)), r["scenario"]))
    return rows


def aggregate_lost(raw: Row) -> list[Row]:
    """One row per (database, hold, strategy) of the ``lost_events`` rounds; ``vs_airflow_shaped``:
    ``lost_pairs`` over ``airflow_3_3``'s at the same hold on the same database."""
    by_cell = _by_cell(raw)
    rows = [{**c, **_outcome([c], by_cell)} for c in raw["cells"] if c["scenario"] == "lost_events"]
    for row in rows:
        row["lost_pct"] = 100 * row["lost_pairs"] / row["pairs"] if row["pairs"] else math.nan
        lost, base = row["lost_pairs"], _baseline(rows, row, "hold_ms").get("lost_pairs", math.nan)
        # 0 lost of Airflow's 0 is as good: 0x, not "not measured".
        row["vs_airflow_shaped"] = 0.0 if base == lost == 0 else tables.ratio(lost, base)
    _in_order(raw, rows, lambda r: r["hold_ms"])
    return rows


def strategy_label(strategy: str) -> str:
    """The strategy's name in the tables, the default one marked."""
    return f"{strategy} (default)" if strategy == DEFAULT_STRATEGY else strategy


def short_label(strategy: str) -> str:
    """The strategy's name in the narrow Markdown tables: the default one marked ``*``."""
    return f"{strategy}*" if strategy == DEFAULT_STRATEGY else strategy


def _ms(key: str, row: Row) -> str:
    """A timed cell of ``row[key]`` (ms), ``-`` where it was not measured."""
    return fmt(row.get(key, math.nan), 2)


def _spread(row: Row, prefix: str = "") -> str:
    """A timed cell: its median and, in brackets, its spread (p25-p75), in ms."""
    p25, p50, p75 = (fmt(row.get(f"{prefix}p{q}_ms", math.nan), 2) for q in (25, 50, 75))
    return f"{p50} [{p25}-{p75}]"


#: Every column of the contention rows: the CSV (``bench-contention.csv``).
_CONTENTION: tables.Columns = {
    "database": "db",
    "scenario": "scenario",
    "strategy": lambda r: strategy_label(r["strategy"]),
    "planned": "planned",
    "ok": "committed",
    "gave up": "abandoned",
    "not started": "not_started",
    "deadlocks": "deadlocks",
    "lock t/o": "lock_timeouts",
    "serial.": "serializations",
    "busy": "busys",
    "retries": "retries",
    "tx/s": "tx_per_s",
    "tx/s vs 3.3": lambda r: times(r["throughput_vs_airflow_3_3"]),
    "p50 ms": "p50_ms",
    "p95 ms": "p95_ms",
    "p99 ms": "p99_ms",
    "max ms": "max_ms",
    "p99 vs 3.3": lambda r: times(r["p99_vs_airflow_3_3"]),
    "stmts/tx": lambda r: fmt(float(r["statements_per_tx"]), 0),
    "rows exact": "rows_exact",
}
#: The two Markdown tables of a database's contention rows, each within 100 columns.
_OUTCOMES: tables.Columns = {
    "scenario": "scenario",
    "strategy": lambda r: short_label(r["strategy"]),
    "ok": "committed",
    "gave up": "abandoned",
    "not started": "not_started",
    "deadlocks": "deadlocks",
    "other": lambda r: fmt(r["lock_timeouts"] + r["serializations"] + r["busys"]),
    "retries": "retries",
    "exact": "rows_exact",
}
_TIMINGS: tables.Columns = {
    "scenario": "scenario",
    "strategy": lambda r: short_label(r["strategy"]),
    "tx/s": "tx_per_s",
    "vs 3.3": lambda r: times(r["throughput_vs_airflow_3_3"]),
    "p50 ms": "p50_ms",
    "p99 ms": "p99_ms",
    "max ms": "max_ms",
    "stmts/tx": lambda r: fmt(float(r["statements_per_tx"]), 0),
}
_LOST: tables.Columns = {
    "database": "db",
    "hold ms": lambda r: f"{r['hold_ms']:g}",
    "producer": lambda r: _PRODUCERS.get(r["strategy"]) or r["strategy"],
    "planned": "planned",
    "events": "events",
    "gave up": "abandoned",
    "not started": "not_started",
    "pairs": "pairs",
    "unconsumed": "lost_pairs",
    "%": "lost_pct",
    "vs Airflow shape": lambda r: "-" if r["strategy"] == "airflow_3_3" else times(r["vs_airflow_shaped"]),
    "late": "late_pairs",
    "runs": "runs",
    "passes": "passes",
    "deadlocks": "deadlocks",
    "p50 ms": "p50_ms",
}
_LOST_MD: tables.Columns = {
    "hold ms": lambda r: f"{r['hold_ms']:g}",
    "producer": lambda r: short_label(r["strategy"]),
    "events": "events",
    "not done": lambda r: fmt(r["abandoned"] + r["not_started"]),
    "unconsumed": "lost_pairs",
    "vs 3.3": lambda r: "-" if r["strategy"] == "airflow_3_3" else times(r["vs_airflow_shaped"]),
    "late": "late_pairs",
    "runs": "runs",
    "deadlocks": "deadlocks",
}
_RATIO: tables.Columns = {
    "fan-out": lambda r: f"F={r['fanout']:,}",
    "ours p50 ms": lambda r: fmt(r["ours_p50_ms"], 2),
    "raw p50 ms": lambda r: fmt(r["raw_p50_ms"], 2),
    "ratio p50": lambda r: times(r["ratio_p50"]),
    "stmts ours/raw": lambda r: f"{r['ours_statements']} / {r['raw_statements']}",
    "exact": "rows_exact",
}
_RATIO_CSV: tables.Columns = {
    "database": "db",
    **_RATIO,
    "ours p50 [p25-p75] ms": lambda r: _spread(r, "ours_"),
    "raw p50 [p25-p75] ms": lambda r: _spread(r, "raw_"),
    "ratio p95": lambda r: times(r["ratio_p95"]),
    "ours p95 ms": lambda r: fmt(r["ours_p95_ms"], 2),
    "raw p95 ms": lambda r: fmt(r["raw_p95_ms"], 2),
}
_SWEEP: tables.Columns = {
    "database": "db",
    "strategy": "strategy",
    "fan-out": "fanout",
    **{f"p{q} ms": functools.partial(_ms, f"p{q}_ms") for q in (25, 50, 75)},
    "statements": lambda r: fmt(r.get("statements", math.nan)),
    "rows exact": lambda r: fmt(r.get("rows_exact")),
    "skipped": lambda r: r.get("skipped", ""),
}


def write_csv(raw: Row, rows: Rows, lost: Rows, out_dir: Path) -> list[Path]:
    """Every column of every table, also those the Markdown leaves out, as CSV: the files written."""
    sweeps = [{"db": db, **r} for db, results in raw.get("sweeps", {}).items() for r in results]
    ratios = [{"db": db, **r} for db, results in raw.get("raw_sql_ratio", {}).items() for r in results]
    written = []
    for name, found, columns in (
        ("contention", rows, _CONTENTION),
        ("lost", lost, _LOST),
        ("sweep", sweeps, _SWEEP),
        ("ratio", ratios, _RATIO_CSV),
    ):
        if found:
            written.append(out_dir / f"bench-{name}.csv")
            tables.write_csv(written[-1], found, columns)
    return written


def _by_db(
    raw: Row, title: str, rows: Callable[[str], Rows], section: Callable[[Row, Rows], list[str]], legend: str
) -> str:
    """Per database with rows (``rows(name)``): a ``### {title}{name} ({version})`` heading and
    ``section(target, rows)``; then ``legend``. Nothing where no database has rows."""
    out = []
    for target in raw["targets"]:
        if mine := rows(target["name"]):
            out += [f"### {title}{target['name']} ({target['version']})\n", *section(target, mine), ""]
    return "\n".join([*out, legend]) if out else ""


def _where(row: Row) -> str:
    """How notes and problems name a summary row."""
    hold = f" hold {row['hold_ms']:g} ms" if row["scenario"] == "lost_events" else ""
    return f"{row['scenario']}/{row['strategy']}{hold}"


def _unaccounted(row: Row) -> str:
    """Why the row's counts do not add up to its plan; ``""`` where they do."""
    if row.get("accounted", True):
        return ""
    done = f"{row['committed']} committed + {row['abandoned']} gave up + {row['not_started']} not started"
    return f"{done} != {row['planned']} planned transactions"


def _notes(raw: Row, rows: Rows, db: str = "") -> list[str]:
    """The notes under a table: why its rows' transactions gave up, counts not adding up, skips on ``db``."""
    notes = []
    for row in rows:
        if row.get("gave_up_why"):
            why = "; ".join(f"{n} {reason}" for reason, n in row["gave_up_why"].items())
            notes.append(f"\n> gave up, {_where(row)}: {why}")
        if unaccounted := _unaccounted(row):
            notes.append(f"\n> COUNTS DO NOT ADD UP, {_where(row)}: {unaccounted}")
    return notes + [f"\n> {s['strategy']}: {s['reason']}." for s in raw.get("skipped", []) if s["db"] == db]


def format_table(raw: Row, rows: Rows) -> str:
    """The comparison table (Markdown), one section per database, then its legend."""

    def section(target: Row, mine: Rows) -> list[str]:
        note = [f"> {SQLITE_NOTE}\n"] if target["name"].startswith("sqlite") else []
        planned = ", ".join(f"{s} {n}" for s, n in dict((r["scenario"], r["planned"]) for r in mine).items())
        tables_ = [tables.table(mine, _OUTCOMES), "", tables.table(mine, _TIMINGS)]
        return [
            *note,
            f"planned transactions per row: {planned}\n",
            *tables_,
            *_notes(raw, mine, target["name"]),
        ]

    legend = tables.legend("contention", **raw.get("sizes", {}))
    return _by_db(raw, "", lambda db: [r for r in rows if r["db"] == db], section, legend)


def format_lost(raw: Row, lost: Rows) -> str:
    """The lost-events table (Markdown), one section per database."""

    def section(target: Row, mine: Rows) -> list[str]:
        first = mine[0]
        sizes = (
            f"{first['producers']} producers of one asset, {first['consumers']} consumer DAGs; per row "
            f"{first['planned']} transactions planned, one event each: {first['pairs']} pairs\n"
        )
        return [sizes, tables.table(mine, _LOST_MD), *_notes(raw, mine)]

    return _by_db(raw, "lost events, ", lambda db: [r for r in lost if r["db"] == db], section, LOST_LEGEND)


def format_ratio(raw: Row) -> str:
    """The raw-SQL ratio row: ``register_asset_change`` + COMMIT against hand-written SQL."""

    def section(target: Row, results: Rows) -> list[str]:
        out = [f"{results[0]['calls']} calls each side per fan-out\n", tables.table(results, _RATIO, 1)]
        if judged := verdict.raw_sql(target["name"], results):
            out.append(f"\nF=1 against its target ({judged.goal}): {judged.measured}, {judged.verdict}")
        return out

    legend = tables.legend("ratio", target=verdict.RAW_SQL.goal)
    rows_of = raw.get("raw_sql_ratio", {}).get
    return _by_db(raw, "register_asset_change vs raw SQL, ", lambda db: rows_of(db, []), section, legend)


def format_sweep(raw: Row) -> str:
    """Fan-out sweep: median single-call latency (ms) and statements, per database (spreads: CSV)."""

    def section(target: Row, results: Rows) -> list[str]:
        fanouts = sorted({r["fanout"] for r in results})
        by = {(r["strategy"], r["fanout"]): r for r in results}
        strategies = sorted(dict.fromkeys(r["strategy"] for r in results), key=lambda s: _ORDER.get(s, 99))
        out = []
        for what, cell in (
            (
                "median latency (ms) of one register_asset_change + COMMIT on an empty queue",
                functools.partial(_ms, "p50_ms"),
            ),
            ("statements it sent", lambda r: f"{r['statements']:,}"),
        ):
            body = [[short_label(s), *(_swept(by[(s, f)], cell) for f in fanouts)] for s in strategies]
            table = tables.markdown(["strategy", *(f"F={f:,}" for f in fanouts)], body, left=1)
            out += [f"{what}\n", table, ""]
        return [*out[:-1], *_notes(raw, [], target["name"])]

    legend = tables.legend("sweep", repeats=raw.get("sizes", {}).get("sweep_repeats", "sweep_repeats"))
    return _by_db(raw, "fan-out sweep, ", lambda db: raw["sweeps"].get(db, []), section, legend)


def _swept(row: Row, cell: Callable[[Row], str]) -> str:
    """A sweep cell: ``skipped``, else ``cell(row)``, marked where the queue rows were not exact."""
    return "skipped" if "skipped" in row else cell(row) + ("" if row["rows_exact"] else " NOT EXACT")


def problems(raw: Row, rows: Rows, lost: Rows = ()) -> list[str]:
    """What fails the run: queue rows not exact or left after the drain, counts that do not add up."""
    found = []
    for r in [*rows, *lost]:
        where = f"{r['db']} {_where(r)}"
        if not r.get("rows_exact", True):
            found.append(f"{where}: queue rows not exact {r['row_check']}")
        if r.get("queue_rows_left") or r.get("consumed_unknown"):
            left = f"{r['queue_rows_left']} queue rows left after the drain"
            found.append(f"{where}: {left}, {r['consumed_unknown']} unknown pairs consumed")
        if unaccounted := _unaccounted(r):
            found.append(f"{where}: {unaccounted}")
    for db, results in raw.get("raw_sql_ratio", {}).items():
        inexact = [r["fanout"] for r in results if not r["rows_exact"]]
        found += [f"{db} raw-SQL ratio F={fanout}: queue rows not exact" for fanout in inexact]
    return found


def plot(raw: Row, rows: Rows, lost: Rows, out_dir: Path) -> list[Path]:
    """One PNG per database: latency and deadlocks per strategy, latency vs fan-out, lost pairs."""
    import matplotlib  # here: only the plots need it

    matplotlib.use("Agg")  # no display: the benchmark runs on servers and in CI
    import matplotlib.pyplot as plt

    colors, s, paths = plt.get_cmap("tab10"), raw["sizes"], []
    title = (
        f"{s['producers']} producers x {s['transactions']} tx, fan-out {s['fanout']}, "
        f"{s['outlets']} outlets, hold {s['hold_ms']:g} ms, {s['rounds']} round(s)"
    )
    for target in raw["targets"]:
        db = target["name"]
        mine = {(r["scenario"], r["strategy"]): r for r in rows if r["db"] == db}
        its_lost = [r for r in lost if r["db"] == db]
        scenarios = list(dict.fromkeys(scenario for scenario, _ in mine))
        strategies = [s for s in STRATEGIES if any(strategy == s for _, strategy in mine)]
        fig = plt.figure(figsize=(15, 8), dpi=70)
        grid = fig.add_gridspec(2, max(4 if its_lost else 3, len(scenarios)))
        for i, scenario in enumerate(scenarios):
            ax = fig.add_subplot(grid[0, i], title=f"{scenario}: latency incl. retries (ms)", yscale="log")
            cells = [mine.get((scenario, s), {}) for s in strategies]
            quantiles = {q: [c.get(f"{q}_ms", math.nan) for c in cells] for q in ("p50", "p95", "p99")}
            _bars(ax, strategies, quantiles, legend=8 if i == 0 else 0, rotation=30, ha="right")
        deadlocks = {sc: [mine.get((sc, s), {}).get("deadlocks", 0) for s in strategies] for sc in scenarios}
        ax = fig.add_subplot(grid[1, 0:2], title="deadlocks per strategy (all rounds)")
        _bars(ax, strategies, deadlocks, "%g")
        ax = fig.add_subplot(grid[1, 2], title="one call + COMMIT, no concurrency (ms)")
        sweep = [r for r in raw["sweeps"].get(db, []) if r.get("latency_s") is not None]
        for k, strategy in enumerate(strategies):
            points = [(r["fanout"], r["latency_s"] * 1000) for r in sweep if r["strategy"] == strategy]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=strategy, color=colors(k))
        ax.set(xscale="log", yscale="log", xlabel="fan-out (consumer DAGs)")
        if ax.get_legend_handles_labels()[0]:  # a run may have drawn no series
            ax.legend(fontsize=7)
        if its_lost:
            holds = sorted({r["hold_ms"] for r in its_lost})
            pairs = {(r["hold_ms"], r["strategy"]): r["lost_pairs"] for r in its_lost}
            shown = [s for s in STRATEGIES if any(r["strategy"] == s for r in its_lost)]
            by_producer = {_PRODUCERS.get(s, s): [pairs.get((h, s), 0) for h in holds] for s in shown}
            ax = fig.add_subplot(grid[1, 3], title=f"unconsumed (event, DAG) pairs of {its_lost[0]['pairs']}")
            _bars(ax, [f"hold {h:g} ms" for h in holds], by_producer, "%g", 7)
        fig.suptitle(f"{target['version']}: {title}")
        fig.tight_layout()
        paths.append(out_dir / f"bench-{db}.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def _bars(
    ax: Any, groups: list[str], series: dict[str, list[float]], shown: str = "", legend: int = 8, **ticks: Any
) -> None:
    """A group of bars per ``groups`` label, one bar per series side by side (``shown``: a format to write
    each bar's value on it); the series' legend in font size ``legend`` (0: none) where there are any."""
    width = 0.8 / max(1, len(series))
    for k, (label, heights) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        drawn = ax.bar(xs, heights, width, label=label)
        if shown:
            ax.bar_label(drawn, fmt=shown, fontsize=7)
    ax.set_xticks(range(len(groups)), groups, fontsize=8, **ticks)
    if legend and series:
        ax.legend(fontsize=legend)
