"""The live run's report: the detail per database (a row per measured quantity, a column per manager; with
``--runs K`` a cell lists the K runs' values separated by ``;``), the verdict (the plug-in against the targets
defined here, once, with stock's figure beside) and what makes the exit status 1."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from airflow_adrq_bench import tables, verdict
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN as MANAGERS
from airflow_adrq_bench.airflow_mode.report import heading
from airflow_adrq_bench.verdict import Line, Target

Cell = dict[str, Any]

#: The plug-in's targets, in the order printed: its correctness, then its speed against stock.
COMPLETED = Target("plug-in deployments completed", "all", lambda v: v == 1)
FAILED = Target("producer tasks failed", "0", lambda v: v == 0)
SERVER_ERRORS = Target("task-success calls answered 5xx", "0", lambda v: v == 0)
DEADLOCKS = Target("deadlocks (server, log lines)", "0", lambda v: v == 0)
EXACT = Target("events written; queue rows left", "exact", lambda v: v == 1)
# Judged on the stranded pairs beyond those allowed (stranded_allowed).
STRANDED = Target("pairs stranded after the bursts", "<= allowed", lambda v: v <= 0)
LOST = Target("pairs lost after one more event", "0", lambda v: v == 0)
TWICE = Target("pairs consumed twice", "0", lambda v: v == 0)
SPEED = Target("PATCH .../state p50 vs stock", "<= 1x", lambda v: v <= 1)
# The p99 against stock's: no worse where stock deadlocked, within 2x where it did not (the goal).
P99 = Target("PATCH .../state p99 vs stock", "<= 2x", lambda v: v <= 2)
P99_STOCK_DEADLOCKED = dataclasses.replace(P99, goal="<= 1x", met=lambda v: v <= 1)
#: apache/airflow#66853's (api-servers killed for memory by a burst of task-success calls), where the
#: cells sampled the api-server's memory: its peak RSS no higher than stock's, the p99 half of it.
MEMORY = Target("api-server peak RSS vs stock", "<= 1x", lambda v: v <= 1)
P99_BURST = Target("PATCH .../state p99, #66853", "<= 0.5x", lambda v: v <= 0.5)
#: With --pause-churn / on PostgreSQL (the lock sampler): only where the cells have them.
CHURN_ERRORS = Target("pause churn requests answered 5xx", "0", lambda v: v == 0)
WAIT = Target("producer wait beyond its longest holder", "<= 100 ms", lambda v: v <= 100)
#: Judged against stock's speed: they fail the run only with --check.
_SPEED_TARGETS = (SPEED.what, P99.what, MEMORY.what, P99_BURST.what)


def _at(section: str, key: str) -> Callable[[Cell], int]:
    return lambda c: int(c[section][key])


def _share(section: str, part: str, whole: str) -> Callable[[Cell], str]:
    """A detail cell ``12 (3%)``: ``c[section][part]`` and its share of ``c[section][whole]``."""

    def shown(c: Cell) -> str:
        n, of = c[section][part], c[section][whole]
        return f"{n} ({100 * n / of:.0f}%)" if of else str(n)

    return shown


def _server_errors(c: Cell) -> int:
    """Task-success calls answered 5xx (a database error in the success transaction)."""
    return sum(n for code, n in c["patch_state"]["status"].items() if code.startswith("5"))


def _latency(c: Cell) -> str:
    p = c["patch_state"]
    if not p["calls"]:
        return "n/a"
    refused = sum(n for code, n in p["status"].items() if not code.startswith("2"))
    times = f"{p['p50_ms']:.0f} / {p['p99_ms']:.0f} / {p['max_ms']:.0f}"
    return f"{times} ({p['calls']} calls, {refused} not 2xx)"


def _churn_errors(c: Cell) -> int:
    """Pause churn requests answered 5xx (0 without the churn)."""
    return int((c.get("churn") or {}).get("5xx", 0))


def _churn(c: Cell) -> str:
    """``requests (pause+unpause / bulk), not 2xx, 5xx; p50 / p99 / max ms`` of the pause churn."""
    churn = c.get("churn")
    if not churn:
        return "-"
    kinds = churn["kinds"]
    toggles = sum(kinds.get(k, {}).get("calls", 0) for k in ("pause", "unpause"))
    bulk = kinds.get("bulk", {}).get("calls", 0)
    times = (
        f"{churn['p50_ms']:.0f} / {churn['p99_ms']:.0f} / {churn['max_ms']:.0f} ms" if churn["calls"] else ""
    )
    return f"{churn['calls']} ({toggles} / {bulk}), {churn['not_2xx']} not 2xx, {churn['5xx']} 5xx; {times}"


def _waits(key: str, count: str = "producer_waits", noun: str = "waits") -> Callable[[Cell], str]:
    """A detail cell of the lock sampler's ``key`` (ms), with how many waits (or ``noun``) it is over."""

    def shown(c: Cell) -> str:
        waits = c.get("lock_waits")
        if not waits:
            return "not sampled"
        value = waits[key]
        return f"{'-' if value is None else f'{value:.0f}'} ({waits.get(count, 0)} {noun})"

    return shown


def _by_holder(c: Cell) -> str:
    """``scheduler 12 (300 / 450), ...``: producer waits per kind of longest holder, with the longest
    wait / the longest holder in ms."""
    waits = c.get("lock_waits")
    if not waits:
        return "not sampled"
    kinds = sorted(waits.get("by_holder", {}).items(), key=lambda kv: -kv[1]["waits"])
    shown = [f"{k} {v['waits']} ({v['wait_max_ms']:.0f} / {v['holder_max_ms']:.0f})" for k, v in kinds]
    return ", ".join(shown) or "-"


def _sampling(c: Cell) -> str:
    waits = c.get("lock_waits")
    if not waits:
        return "not sampled"
    every = waits["interval_ms"]
    error = f"; stopped: {waits['error']}" if waits.get("error") else ""
    return f"{waits['samples']} samples, every {every['p50']} ms (max gap {every['max']} ms){error}"


def _memory(show: Callable[[dict[str, Any]], str]) -> Callable[[Cell], str]:
    """A detail cell of the api-server's memory samples (:mod:`.memory`), shown by ``show``."""

    def shown(c: Cell) -> str:
        sampled = c.get("api_server_memory")
        return show(sampled) if sampled and sampled["samples"] else "not sampled"

    return shown


def _rss(m: dict[str, Any]) -> str:
    """``301 / 455 (2 processes; at 84 s)``: the tree's RSS sum before the bursts / at its peak, MB."""
    n = len(m["processes"])
    return (
        f"{m['before_mb']:.0f} / {m['peak_mb']:.0f} ({n} process{'es' * (n != 1)}; at {m['peak_at_s']:.0f} s)"
    )


def _per_process(m: dict[str, Any]) -> str:
    """``455 / 470, 120 / 121``: each process's (the api-server's first) sampled peak / VmHWM, MB."""

    def mb(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    return ", ".join(f"{mb(p['peak_rss_mb'])} / {mb(p['hwm_mb'])}" for p in m["processes"])


def _connections(m: dict[str, Any]) -> str:
    """``5 / 15``: the tree's TCP connections to the database's port (``-``: not counted)."""
    before, most = m.get("db_connections_before"), m.get("db_connections_max")
    return "-" if before is None else f"{before} / {most}"


def _in_flight(c: Cell) -> str:
    """``52 / 40``: the most requests in flight at once during the bursts, all / task-state calls."""
    found = c.get("in_flight") or {}
    return "-" if found.get("all") is None else f"{found['all']} / {found['patch_state']}"


def _deadlock_server(c: Cell) -> str:
    d = c["deadlocks"]
    if d["server_scope"] == "database":
        return str(d["server"])
    ours = {True: "yes", False: "no", None: "?"}[d["latest_names_database"]] if d["server"] else "-"
    return f"{d['server']} (server-wide; ours? {ours})"


def _our_deadlocks(c: Cell) -> int:
    """The deployment's deadlocks: the log lines, and the server counter's where it is the scratch
    database's, or MariaDB/MySQL's server-wide one when InnoDB's latest deadlock names it."""
    d = c["deadlocks"]
    server = d["server"] if d["server_scope"] == "database" or d["latest_names_database"] else 0
    return int(server + d["log_lines_components"] + d["log_lines_tasks"])


def _both(key: str) -> str:
    """A detail cell ``after the bursts / at the end`` of ``key``."""
    return f"{{after_bursts[{key}]}} / {{after_extra[{key}]}}"


def _written(c: Cell) -> int:
    return sum(c["events"]["written"].values())


#: The api-server's memory (:mod:`.memory`), shown for a failed deployment too: sampled until the
#: burst that failed (an api-server that stopped answering is what #66853 is about).
MEMORY_ROWS: list[tuple[str, Callable[[Cell], str]]] = [
    ("api-server RSS, sum of its processes: before the bursts / peak, MB", _memory(_rss)),
    (
        "the same, peak per burst, MB",
        _memory(lambda m: ", ".join(f"{v:.0f}" for v in m["per_mark"].values())),
    ),
    ("api-server peak per process: sampled RSS / VmHWM, MB", _memory(_per_process)),
    ("api-server database connections: before the bursts / most", _memory(_connections)),
    (
        "api-server threads: before the bursts / most at once",
        _memory(lambda m: f"{m['threads_before']} / {m['threads_max']}"),
    ),
    (
        "memory samples during the bursts",
        _memory(
            lambda m: (
                f"{m['samples']}, every {m['interval_ms']['p50']} ms (max gap {m['interval_ms']['max']} ms)"
            )
        ),
    ),
]

#: The detail table: (row label, a format of the cell's fields or a function of it).
ROWS: list[tuple[str, str | Callable[[Cell], str]]] = [
    ("producer tasks failed", _share("tasks", "failed", "tasks")),
    ("producer tasks retried", "{tasks[retried]}"),
    ("deadlocks, server counter", _deadlock_server),
    (
        "deadlock lines in logs (components / tasks)",
        "{deadlocks[log_lines_components]} / {deadlocks[log_lines_tasks]}",
    ),
    ("task-success calls answered 5xx", lambda c: str(_server_errors(c))),
    ("asset events written / expected", lambda c: f"{_written(c)} / {c['events']['expected']}"),
    ("consumer runs (after the bursts / at the end)", _both("consumer_runs")),
    ("(event, consumer) pairs", "{after_bursts[pairs]}"),
    ("stranded after the bursts", _share("after_bursts", "stranded", "pairs")),
    # a0 & a1 & ... consumers (--own-assets) whose condition a burst left incomplete.
    ("waiting for an all-of consumer's other assets", "{after_bursts[waiting]}"),
    ("stranded, of the last burst alone", _share("after_bursts", "last_burst_stranded", "last_burst_pairs")),
    ("still unconsumed after one more event", _share("after_extra", "stranded", "pairs")),
    ("pairs consumed twice", "{after_extra[consumed_twice]}"),
    ("queue rows left (after the bursts / at the end)", _both("queue_rows")),
    (
        "trigger to done, s (per burst)",
        lambda c: ", ".join(
            "?" if (s := b["trigger_to_done_s"]) is None else f"{s:.0f}" for b in c["bursts"]
        ),
    ),
    ("PATCH .../state p50 / p99 / max ms", _latency),
    *MEMORY_ROWS,
    ("api-server requests in flight, most at once: all / PATCH .../state", _in_flight),
    ("pause churn: requests (pause+unpause / bulk), answers; ms", _churn),
    ("lock samples during the bursts", _sampling),
    ("producer waits for a consumer's dag row: longest, ms", _waits("producer_wait_max_ms")),
    ("longest holder a producer waited for, ms", _waits("holder_max_ms")),
    ("producer waits by longest holder: n (longest wait / holder, ms)", _by_holder),
    ("worst producer wait beyond its longest holder, ms", _waits("excess_max_ms")),
    ("the same per queue write, its waits summed, ms", _waits("write_excess_max_ms", "writes", "writes")),
    ("other lock waits: longest, ms", _waits("other_wait_max_ms", "other_waits")),
    ("deployment, s", "{duration_s:.0f}"),
]


_SHOWN_ON_ERROR = frozenset(row for _, row in MEMORY_ROWS)


def format_tables(raw: dict[str, Any]) -> str:
    """Markdown: the run's sizes and plug-in, per database a table (rows x managers), the legend."""
    sizes, cells = raw["sizes"], raw["cells"]
    own = "each producer DAG's own outlets (half on the OR of all, half on the AND)"
    on = own if sizes["own_assets"] else "the OR of the outlets"
    start_up = "; ".join(sorted({str(c.get("plugin_start_up")) for c in cells if c["manager"] == "plugin"}))
    lines = [
        heading("Live Airflow, stock AssetManager vs airflow-adrq's plug-in", raw),
        "",
        f"{sizes['producer_dags']} producer DAG(s) x {sizes['instances']} mapped instances x "
        f"{sizes['outlets']} outlets, {sizes['consumers']} consumer DAGs on {on}, {sizes['bursts']} bursts "
        f"(a burst's instances finish together, each a random 0 to {sizes['spread_s']:g} s after a common "
        f"deadline), {raw['runs']} run(s). Plug-in: {raw['plugin_source']}; asset_manager_kwargs "
        f"{raw['plugin_kwargs'] or '(none)'}; its start-up line: {start_up}.",
    ]
    for db in dict.fromkeys(c["db"] for c in cells):
        mine = sorted((c for c in cells if c["db"] == db), key=lambda c: c["run"])
        managers = [m for m in MANAGERS if any(c["manager"] == m for c in mine)]

        def value(c: Cell, row: str | Callable[[Cell], str]) -> str:
            if c["error"] and row not in _SHOWN_ON_ERROR:
                return "error"
            return row.format_map(c) if isinstance(row, str) else row(c)

        body = [
            [label, *("; ".join(value(c, row) for c in mine if c["manager"] == m) for m in managers)]
            for label, row in ROWS
        ]
        lines += ["", f"### {db}: {mine[0]['version']}; {shape_label(mine[0]['shape'])}", ""]
        lines.append(tables.markdown(["", *managers], body, left=1))
        lines += [
            f"\n* {c['manager']} run {c['run']} failed: {c['error'].splitlines()[0]} (logs: {c['log_dir']})"
            for c in mine
            if c["error"]
        ]
    return "\n".join([*lines, "", tables.legend("live")])


def shape_label(shape: dict[str, Any]) -> str:
    """``CeleryExecutor, 2 Celery workers, PgBouncer (transaction pooling), 2 schedulers, 1 api-server
    worker`` and the like."""

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"

    parts = [str(shape["executor"])]
    parts += [count(shape["celery_workers"], "Celery worker")] if shape["celery_workers"] else []
    parts.append("PgBouncer (transaction pooling)" if shape["pgbouncer"] else "direct")
    parts += [count(shape["schedulers"], "scheduler"), count(shape["api_workers"], "api-server worker")]
    parts += [f"DAG files re-parsed every {shape['reparse_s']} s"] if shape["reparse_s"] else []
    parts += ["REST pause churn"] if shape.get("pause_churn") else []
    return ", ".join(parts)


def plugin_policy(cell: Cell) -> str:
    """The ``on_conflict`` the plug-in's start-up line names (``auto`` if it names none)."""
    found = re.search(r"on_conflict=(\w+)", str(cell.get("plugin_start_up") or ""))
    return found.group(1) if found else "auto"


def stranded_allowed(cell: Cell) -> int:
    """Stranded pairs after the bursts that are a note, not a miss (GUARANTEES.md, "Timing").

    None where the scheduler locks the rows it consumes (PostgreSQL, MySQL 8) and the plug-in
    refreshes in the statement. All on MariaDB, whose scheduler takes no row locks (the refresh
    after COMMIT loses the race with its read-then-delete now and then: 0-0.3 % at the default
    size, 0-17 % at --small, BENCHMARKS.md), and with ``on_conflict=ignore`` (Airflow's ``DO
    NOTHING``) anywhere. Pairs still unconsumed after one more event are lost everywhere.
    """
    policy = plugin_policy(cell)
    if policy == "ignore" or (str(cell["version"]).startswith("MariaDB") and policy != "refresh"):
        return int(cell["after_bursts"]["pairs"])
    return 0


def verdict_lines(cells: Sequence[Cell]) -> list[Line]:
    """Per database, the plug-in's completed deployments (summed over the runs) against the targets,
    with stock's figure beside where stock completed."""
    lines: list[Line] = []
    for db in dict.fromkeys(c["db"] for c in cells):
        plugin = [c for c in cells if c["db"] == db and c["manager"] == "plugin"]
        stock = [c for c in cells if c["db"] == db and c["manager"] == "stock" and not c["error"]]
        done = [c for c in plugin if not c["error"]]
        if len(done) < len(plugin):
            lines.append(Line(db, COMPLETED.what, COMPLETED.goal, f"{len(done)} of {len(plugin)}", "MISSED"))
        if done:
            lines += _judged(db, done, stock)
    return lines


def _judged(db: str, plugin: Sequence[Cell], stock: Sequence[Cell]) -> list[Line]:
    def total(of: Callable[[Cell], int], cells: Sequence[Cell] = plugin) -> int:
        return sum(map(of, cells))

    def line(target: Target, of: Callable[[Cell], int], whole: str = "", beyond: int = 0) -> Line:
        beside = f" (stock {total(of, stock)})" if stock else ""
        return verdict.line(db, target, total(of) - beyond, f"{total(of)}{whole}{beside}")

    written, expected = total(_written), total(_at("events", "expected"))
    left = total(lambda c: c["after_bursts"]["queue_rows"] + c["after_extra"]["queue_rows"])
    allowed, pairs = total(stranded_allowed), f" of {total(_at('after_bursts', 'pairs'))}"
    stranded = dataclasses.replace(STRANDED, goal=f"<= {allowed}")  # the goal printed: the number allowed
    lines = [
        line(FAILED, _at("tasks", "failed"), f" of {total(_at('tasks', 'tasks'))}"),
        line(SERVER_ERRORS, _server_errors),
        line(DEADLOCKS, _our_deadlocks),
        verdict.line(db, EXACT, written == expected and not left, f"{written} of {expected}; {left}"),
        line(stranded, _at("after_bursts", "stranded"), pairs, beyond=allowed),
        line(LOST, _at("after_extra", "stranded")),
        line(TWICE, _at("after_extra", "consumed_twice")),
    ]
    if any(c.get("churn") for c in plugin):
        lines.append(line(CHURN_ERRORS, _churn_errors))
    if sampled := [c["lock_waits"] for c in plugin if c.get("lock_waits")]:
        lines.append(_wait(db, sampled))
    if all(c.get("api_server_memory") for c in plugin):
        lines += _burst(db, plugin, stock)
    return [*lines, _p99(db, plugin, stock), _speed(db, plugin, stock)]


def _burst(db: str, plugin: Sequence[Cell], stock: Sequence[Cell]) -> list[Line]:
    """#66853's targets: the api-server's peak RSS (the sum over its processes) and the PATCH p99 against
    stock's (means over the runs); n/a without a completed stock deployment that measured them."""

    def mean(cells: Sequence[Cell], of: Callable[[Cell], float | None]) -> float | None:
        values = [v for c in cells if (v := of(c)) is not None]
        return sum(values) / len(values) if values else None

    lines = []
    for target, of, unit in (
        (MEMORY, lambda c: (c.get("api_server_memory") or {}).get("peak_mb"), "MB"),
        (P99_BURST, lambda c: c["patch_state"]["p99_ms"] if c["patch_state"]["calls"] else None, "ms"),
    ):
        ours, base = mean(plugin, of), mean(stock, of)
        if ours is None or base is None:
            lines.append(
                Line(
                    db,
                    target.what,
                    target.goal,
                    "not measured" if ours is None else "no stock to compare",
                    "n/a",
                )
            )
        else:
            lines.append(
                verdict.ratio_line(db, target, ours, base, shown=f"{ours:.0f} vs {base:.0f} {unit}: ")
            )
    return lines


def _wait(db: str, sampled: Sequence[dict[str, Any]]) -> Line:
    """The worst producer wait minus the longest transaction it waited for, over the sampled cells."""
    waits = sum(s["producer_waits"] for s in sampled)
    excess = max((s["excess_max_ms"] for s in sampled if s["excess_max_ms"] is not None), default=0.0)
    holder = max((s["holder_max_ms"] or 0.0 for s in sampled), default=0.0)
    return verdict.line(db, WAIT, excess, f"{excess:.0f} ms ({waits} waits; longest holder {holder:.0f} ms)")


def _p99(db: str, plugin: Sequence[Cell], stock: Sequence[Cell]) -> Line:
    """The plug-in's PATCH p99 against stock's (means over the runs): <= 1x where stock deadlocked or
    failed tasks, else <= 2x; n/a without a completed stock deployment."""
    ours = [c["patch_state"]["p99_ms"] for c in plugin if c["patch_state"]["calls"]]
    base = [c["patch_state"]["p99_ms"] for c in stock if c["patch_state"]["calls"]]
    if not ours or not base:
        return Line(db, P99.what, P99.goal, "no stock to compare" if not base else "no calls", "n/a")
    worse = any(_our_deadlocks(c) or c["tasks"]["failed"] for c in stock)
    target = P99_STOCK_DEADLOCKED if worse else P99
    mean_ours, mean_base = sum(ours) / len(ours), sum(base) / len(base)
    shown = f"{mean_ours:.0f} vs {mean_base:.0f} ms: "
    return verdict.ratio_line(db, target, mean_ours, mean_base, shown=shown)


def _speed(db: str, plugin: Sequence[Cell], stock: Sequence[Cell]) -> Line:
    """The plug-in's PATCH p50 against stock's (means over the runs), judged as equal where their
    interquartile ranges overlap; n/a without a completed stock deployment."""
    ours = [c["patch_state"] for c in plugin if c["patch_state"]["calls"]]
    base = [c["patch_state"] for c in stock if c["patch_state"]["calls"]]
    if not ours or not base:
        return Line(db, SPEED.what, SPEED.goal, "no stock to compare" if not base else "no calls", "n/a")

    def mean(of: Sequence[dict[str, Any]], key: str) -> float:
        return float(sum(p[key] for p in of) / len(of))

    spreads = ((mean(ours, "p25_ms"), mean(ours, "p75_ms")), (mean(base, "p25_ms"), mean(base, "p75_ms")))
    return verdict.ratio_line(db, SPEED, mean(ours, "p50_ms"), mean(base, "p50_ms"), spreads=spreads)


def problems(
    cells: Sequence[Cell], lines: Sequence[Line], *, check: bool = False, expect_stock_worse: bool = False
) -> list[str]:
    """What makes the exit status 1: a deployment that did not complete, a missed target of
    correctness (with ``check``, the speed target too), and with ``expect_stock_worse`` a stock that
    had neither failed producer tasks nor stranded pairs in any deployment."""
    failed = [c for c in cells if c["error"]]
    out = [
        f"{c['db']} {c['manager']} run {c['run']}: did not complete: {c['error'].splitlines()[0]}"
        for c in failed
    ]
    out += [
        f"{m.db}: {m.what}: {m.measured} (target {m.goal})"
        for m in verdict.missed(lines)
        if m.what != COMPLETED.what and (check or m.what not in _SPEED_TARGETS)
    ]
    stock = [c for c in cells if c["manager"] == "stock" and not c["error"]]
    if expect_stock_worse and not any(c["tasks"]["failed"] or c["after_bursts"]["stranded"] for c in stock):
        out.append(
            f"--expect-stock-worse: stock had no failed task and no stranded pair in {len(stock)} runs"
        )
    return out
