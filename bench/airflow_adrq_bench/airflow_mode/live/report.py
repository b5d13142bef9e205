"""The live run's table (with its legend), JSON, PNG and the checks behind the exit status.

One table per database: a row per measured quantity, a column per manager
(``stock`` beside ``plugin``); with ``--runs K`` a cell lists the K runs'
values separated by ``;``. Each table's heading names the deployments' shape
(executor and workers, PgBouncer, schedulers, api-server workers), as each
cell's ``shape`` does in the JSON. The legend says what each row counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots, tables
from airflow_adrq_bench.airflow_mode.live.config import MANAGERS

__all__ = [
    "ROWS",
    "format_tables",
    "notes",
    "plot",
    "plugin_policy",
    "problems",
    "shape_label",
    "stranded_allowed",
    "write_json",
]

Cell = dict[str, Any]


def _pct(c: Cell, of: str, part: str, whole: str) -> float:
    """``c[of][part]`` as a percentage of ``c[of][whole]`` (0 of nothing)."""
    return 100 * c[of][part] / c[of][whole] if c[of][whole] else 0.0


def _share(of: str, part: str, whole: str) -> Callable[[Cell], str]:
    """A row's cell ``12 (3%)``: ``c[of][part]`` and its share of ``c[of][whole]``."""
    return lambda c: f"{c[of][part]} ({_pct(c, of, part, whole):.0f}%)" if c[of][whole] else str(c[of][part])


def _bursts(c: Cell) -> str:
    values = [b.get("trigger_to_done_s") for b in c.get("bursts", [])]
    return ", ".join("?" if v is None else f"{v:.0f}" for v in values)


def _latency(c: Cell) -> str:
    p = c.get("patch_state", {})
    if not p.get("calls"):
        return "n/a"
    refused = sum(n for code, n in p.get("status", {}).items() if not code.startswith("2"))
    return f"{p['p50_ms']:.0f} / {p['p99_ms']:.0f} ({p['calls']} calls, {refused} not 2xx)"


def _server_errors(c: Cell) -> int:
    """Task-success calls answered 5xx (a database error in the success transaction)."""
    return sum(n for code, n in c["patch_state"]["status"].items() if code.startswith("5"))


def _deadlock_server(c: Cell) -> str:
    d = c["deadlocks"]
    if d["server_scope"] == "server":
        ours = {True: "yes", False: "no", None: "?"}[d["latest_names_database"]] if d["server"] else "-"
        return f"{d['server']} (server-wide; ours? {ours})"
    return str(d["server"])


def _events(c: Cell) -> str:
    written = sum(c["events"]["written"].values())
    return f"{written} / {c['events']['expected']}"


#: (row label, value of one cell: a format of the cell's fields or a function of it). A cell with an
#: error shows "error" on every row.
ROWS: list[tuple[str, str | Callable[[Cell], str]]] = [
    ("producer tasks failed", _share("tasks", "failed", "tasks")),
    ("producer tasks retried", "{tasks[retried]}"),
    ("deadlocks, server counter", _deadlock_server),
    (
        "deadlock lines in logs (components / tasks)",
        "{deadlocks[log_lines_components]} / {deadlocks[log_lines_tasks]}",
    ),
    ("task-success calls answered 5xx", lambda c: str(_server_errors(c))),
    ("asset events written / expected", _events),
    (
        "consumer runs (after the bursts / at the end)",
        "{after_bursts[consumer_runs]} / {after_extra[consumer_runs]}",
    ),
    ("(event, consumer) pairs", "{after_bursts[pairs]}"),
    ("stranded after the bursts", _share("after_bursts", "stranded", "pairs")),
    # a0 & a1 & ... consumers (--own-assets) whose condition a burst left incomplete.
    ("waiting for an all-of consumer's other assets", lambda c: str(c["after_bursts"].get("waiting", 0))),
    ("stranded, of the last burst alone", _share("after_bursts", "last_burst_stranded", "last_burst_pairs")),
    ("still unconsumed after one more event", _share("after_extra", "stranded", "pairs")),
    ("pairs consumed twice", "{after_extra[consumed_twice]}"),
    (
        "queue rows left (after the bursts / at the end)",
        "{after_bursts[queue_rows]} / {after_extra[queue_rows]}",
    ),
    ("trigger to done, s (per burst)", _bursts),
    ("PATCH .../state p50 / p99 ms", _latency),
    ("deployment, s", "{duration_s:.0f}"),
]


def _value(cell: Cell, row: str | Callable[[Cell], str]) -> str:
    if cell.get("error"):
        return "error"
    try:
        return row.format_map(cell) if isinstance(row, str) else row(cell)
    except (KeyError, TypeError, ZeroDivisionError):
        return "?"


def format_tables(raw: dict[str, Any]) -> str:
    """Markdown: per database a table (rows x managers), then the legend, the problems."""
    sizes = raw["sizes"]
    lines = [
        f"## Live Airflow {raw.get('airflow_version', '?')}: stock AssetManager vs airflow-adrq's plug-in",
        "",
        f"{sizes['producer_dags']} producer DAG(s) x {sizes['instances']} mapped instances x "
        f"{sizes['outlets']} outlets, {sizes['consumers']} consumer DAGs on "
        + (
            "each producer DAG's own outlets (half on the OR of all of them, half on the AND), "
            if sizes.get("own_assets")
            else "the OR of the outlets, "
        )
        + f"{sizes['bursts']} bursts (a burst's instances finish together, each a random 0 to "
        f"{sizes.get('spread_s', 0):g} s after a common deadline), {raw.get('runs', 1)} run(s); "
        f"{raw.get('cpus')} CPUs.",
    ]
    source = raw.get("plugin_source") or {}
    if source.get("commit"):
        changed = source.get("uncommitted") or []
        lines += [
            "",
            f"Plug-in: airflow_adrq at {source['commit'][:10]}"
            + (f" plus uncommitted changes to {', '.join(changed)}" if changed else "")
            + f" ({source.get('path')}).",
        ]
    starts = sorted({str(c["plugin_start_up"]) for c in raw["cells"] if c.get("plugin_start_up")})
    if raw.get("plugin_kwargs") or starts:
        lines += [
            "",
            f"Plug-in settings: asset_manager_kwargs {raw.get('plugin_kwargs') or '(none)'}; its start-up "
            f"line: {'; '.join(starts) or '?'}.",
        ]
    cells: list[Cell] = raw["cells"]
    for db in dict.fromkeys(c["db"] for c in cells):
        mine = sorted((c for c in cells if c["db"] == db), key=lambda c: c["run"])
        managers = [m for m in MANAGERS if any(c["manager"] == m for c in mine)]
        body = [
            [label, *("; ".join(_value(c, row) for c in mine if c["manager"] == m) for m in managers)]
            for label, row in ROWS
        ]
        heading = f"### {db}: {mine[0]['version']}; {shape_label(_shape(mine[0]))}"
        lines += ["", heading, "", tables.markdown(["", *managers], body, left=1)]
        errors = [c for c in mine if c.get("error")]
        for c in errors:
            lines += ["", f"* {c['manager']} run {c['run']} failed: {c['error'].splitlines()[0]}"]
            lines.append(f"  (api-server log: {c.get('api_server_log')})")
    lines += ["", tables.legend("live")]
    if raw.get("notes"):
        lines += ["Notes:", *[f"* {n}" for n in raw["notes"]], ""]
    if raw.get("problems"):
        lines += ["Problems:", *[f"* {p}" for p in raw["problems"]], ""]
    lines.append(f"Took {raw.get('duration_s', math.nan):.0f} s.")
    return "\n".join(lines) + "\n"


def _shape(cell: Cell) -> dict[str, Any]:
    """A cell's shape (results written before shapes were recorded: one LocalExecutor, direct)."""
    return cell.get("shape") or {
        "executor": "LocalExecutor",
        "celery_workers": 0,
        "pgbouncer": False,
        "schedulers": cell.get("schedulers", 1),
        "api_workers": 1,
    }


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def shape_label(shape: dict[str, Any]) -> str:
    """``CeleryExecutor, 2 Celery workers, PgBouncer, 2 schedulers, 1 api-server worker`` and the like."""
    parts = [str(shape["executor"])]
    if shape.get("celery_workers"):
        parts.append(_count(shape["celery_workers"], "Celery worker"))
    parts.append("PgBouncer (transaction pooling)" if shape.get("pgbouncer") else "direct")
    parts.append(_count(shape["schedulers"], "scheduler"))
    parts.append(_count(shape["api_workers"], "api-server worker"))
    if shape.get("reparse_s"):
        parts.append(f"DAG files re-parsed every {shape['reparse_s']} s")
    return ", ".join(parts)


def plugin_policy(cell: Cell) -> str:
    """The ``on_conflict`` the plug-in's start-up line names (``auto`` if it names none)."""
    found = re.search(r"on_conflict=(\w+)", str(cell.get("plugin_start_up") or ""))
    return found.group(1) if found else "auto"


def stranded_allowed(cell: Cell) -> int:
    """Stranded pairs after the bursts that are a note, not a problem (GUARANTEES.md, "Timing").

    None where the scheduler locks the rows it consumes (PostgreSQL, MySQL 8)
    and the plug-in refreshes in the statement. All of them on MariaDB,
    whose scheduler takes no row locks (the refresh after COMMIT loses the
    race with its read-then-delete now and then: 0 % and 0.3 % at the default
    size, 0-17 % at the test suite's, BENCHMARKS.md), and with
    ``on_conflict=ignore`` anywhere (Airflow's ``DO NOTHING``). Pairs still
    unconsumed after one more event stay a problem everywhere.
    """
    policy = plugin_policy(cell)
    if policy == "ignore" or (str(cell.get("version", "")).startswith("MariaDB") and policy != "refresh"):
        return int(cell["after_bursts"]["pairs"])
    return 0


def notes(cells: Sequence[Cell]) -> list[str]:
    """What the table shows that is by design, with why (printed, exit status unchanged)."""
    return [
        f"{c['db']} plugin run {c['run']}: {c['after_bursts']['stranded']} pairs waited for the next "
        f"event, within the {stranded_allowed(c)} on_conflict={plugin_policy(c)} allows here "
        "(GUARANTEES.md, Timing)"
        for c in cells
        if c["manager"] == "plugin"
        and not c.get("error")
        and 0 < c["after_bursts"]["stranded"] <= stranded_allowed(c)
    ]


def problems(cells: Sequence[Cell], *, expect_stock_worse: bool = False) -> list[str]:
    """What makes the exit status 1 (see ``--help``); empty when everything held."""
    out = []
    for c in cells:
        where = f"{c['db']} {c['manager']} run {c['run']}"
        if c.get("error"):
            out.append(f"{where}: did not complete: {c['error'].splitlines()[0]} (logs: {c.get('log_dir')})")
            continue
        if c["manager"] != "plugin":
            continue
        d = c["deadlocks"]
        checks = {
            "failed producer tasks": c["tasks"]["failed"],
            "deadlocks (server counter)": d["server"]
            if d["server_scope"] == "database" or d["latest_names_database"]
            else 0,
            "deadlock lines in logs": d["log_lines_components"] + d["log_lines_tasks"],
            "stranded pairs after the bursts": 0
            if c["after_bursts"]["stranded"] <= stranded_allowed(c)
            else c["after_bursts"]["stranded"],
            "pairs still unconsumed after one more event": c["after_extra"]["stranded"],
            "pairs consumed twice": c["after_extra"]["consumed_twice"],
            "queue rows left": c["after_bursts"]["queue_rows"] + c["after_extra"]["queue_rows"],
            "task-success calls answered 5xx": _server_errors(c),
        }
        for what, n in checks.items():
            if n:
                out.append(f"{where}: {n} {what}")
        written = sum(c["events"]["written"].values())
        if written != c["events"]["expected"]:
            out.append(f"{where}: {written} asset events written, {c['events']['expected']} expected")
    if expect_stock_worse:
        stock = [c for c in cells if c["manager"] == "stock" and not c.get("error")]
        worse = [c for c in stock if c["tasks"]["failed"] or c["after_bursts"]["stranded"]]
        if not worse:
            out.append(
                "--expect-stock-worse: stock had no failed producer task and no stranded pair in any "
                f"of its {len(stock)} completed deployment(s)"
            )
    return out


def write_json(raw: dict[str, Any], path: Path) -> None:
    """The raw results (every cell, every count), indented."""
    tables.write_json(path, raw, indent=2)


def plot(raw: dict[str, Any], path: Path) -> Path | None:
    """One PNG: per database and manager, failed tasks and stranded pairs (%), and PATCH latency."""
    plt = plots.pyplot()
    cells = [c for c in raw["cells"] if not c.get("error")]
    if not cells:
        return None
    groups = list(dict.fromkeys((c["db"], c["manager"]) for c in cells))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    metrics = {
        "producer tasks failed": ("tasks", "failed", "tasks"),
        "stranded after the bursts": ("after_bursts", "stranded", "pairs"),
        "unconsumed after one more event": ("after_extra", "stranded", "pairs"),
    }
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ticks = [f"{db}\n{m}" for db, m in groups]
    mine = [[c for c in cells if (c["db"], c["manager"]) == g] for g in groups]
    series: list[plots.Series] = [
        (label, [mean([_pct(c, *m) for c in group]) for group in mine], {}) for label, m in metrics.items()
    ]
    plots.bars(left, ticks, series, "%.3g")
    left.set(ylabel="% of producer tasks / of (event, consumer) pairs", title="Failures and stranded events")
    patches = [[c["patch_state"] for c in group if c["patch_state"]["calls"]] for group in mine]
    series = [(q, [mean([p[f"{q}_ms"] for p in group]) for group in patches], {}) for q in ("p50", "p99")]
    plots.bars(right, ticks, series, "%.0f")
    right.set(ylabel="ms", title="PATCH /execution/task-instances/{id}/state (api-server access log)")
    for ax in (left, right):
        ax.legend(fontsize=8)
    sizes = raw["sizes"]
    title = (
        f"airflow-adrq bench --airflow --live: {sizes['producer_dags']} x {sizes['instances']} instances x "
        f"{sizes['outlets']} outlets, {sizes['consumers']} consumers, {sizes['bursts']} bursts"
    )
    return plots.save(fig, title, path, dpi=110)
