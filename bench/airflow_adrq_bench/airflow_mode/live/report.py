"""The live run's table (with its legend), JSON, PNG and the checks behind the exit status.

One table per database: a row per measured quantity, a column per manager
(``stock`` beside ``plugin``); with ``--runs K`` a cell lists the K runs'
values separated by ``;``. Each table's heading names the deployments' shape
(executor and workers, PgBouncer, schedulers, api-server workers), as each
cell's ``shape`` does in the JSON. The legend says what each row counts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import plots
from airflow_adrq_bench.airflow_mode.live.config import MANAGERS

__all__ = [
    "LEGEND",
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

LEGEND = """\
Legend (per deployment: one manager on its own scratch database; see `--help` for the sizes; with
several runs a cell lists each run's value, separated by `;`)
* `stock`: Airflow's own `airflow.assets.manager.AssetManager`; `plugin`:
  `airflow_adrq.airflow.AdrqAssetManager`; set through `AIRFLOW__CORE__ASSET_MANAGER_CLASS` on every
  component (api-server, scheduler(s), DAG processor, Celery workers), on 127.0.0.1.
* shape (each table's heading): the executor (LocalExecutor; or CeleryExecutor, its workers on a
  Redis database and a queue of the deployment's own, results in the scratch database); `PgBouncer`:
  every component reaches PostgreSQL through a throwaway PgBouncer in transaction pooling mode
  (`airflow db migrate` directly), `direct` without; the schedulers (2: Airflow's HA mode); the
  api-server's worker processes.
* producer tasks failed: producer task instances of the bursts in state `failed` at the end (Airflow
  3.3's task-success endpoint sets a task whose success transaction deadlocked FAILED directly, whatever
  its retries). retried: those with `try_number` > 1.
* deadlocks, server counter: PostgreSQL `pg_stat_database.deadlocks` of the scratch database (only this
  deployment uses it), difference from before the components started to after they stopped.
  MariaDB/MySQL: `Innodb_deadlocks` of the whole server (other clients' deadlocks count too; `ours?`
  tells whether InnoDB's latest detected deadlock names the scratch database).
* deadlock lines in logs: lines with `deadlock detected`, `Deadlock found`, `40P01` or `(1213,` in the
  components' logs / in the task logs (a traceback holds about 2 such lines per deadlock). Only the
  errors Airflow logs with their message: a database error that escapes the task-success endpoint
  (e.g. at its COMMIT) goes to the api-server's generic handler, which logs the statement and the
  stack under an error id but not the error itself, and answers 500: see the next row.
* task-success calls answered 5xx: `PATCH .../state` calls of the bursts' producer tasks answered
  with a server error (from the access log): the success transaction failed on a database error the
  endpoint did not handle; the task SDK retries the call, so the task may still succeed.
* asset events written / expected: `asset_event` rows with a producer DAG's burst run as source /
  instances x outlets x producer DAGs x bursts.
* consumer runs: runs of the consumer DAGs after the bursts' drain / at the end (after one more event).
* pairs: (event, consumer DAG) pairs, every producer event times every consumer DAG scheduled on its
  asset. A pair is consumed when `dagrun_asset_event` links the event to a run of that DAG.
* stranded after the bursts: pairs no run consumed once the queue drained after the last burst (no
  queue row left, no new consumer run for a few seconds); of the last burst alone: its events' pairs.
* still unconsumed after one more event: the same after one more event of every outlet asset was sent
  through `POST /api/v2/assets/events` (the extra events themselves are not counted) and drained: a
  stranded pair that the next event picks up was late; one still unconsumed was lost to its consumer.
* pairs consumed twice: (event, DAG) consumed by more than one run of that DAG, at the end.
* queue rows left: `asset_dag_run_queue` rows after the bursts' drain / at the end.
* trigger to done: seconds from the burst's first `POST /api/v2/dags/{id}/dagRuns` to the answer of
  its last producer task's success call (the access log's line; a task's `end_date` is stamped by the
  task SDK before that call), per burst.
* PATCH .../state: server-side duration of the task-success call `PATCH
  /execution/task-instances/{id}/state` of the bursts' producer tasks, from the api-server's own
  access log (Airflow 3.3's `HttpAccessLogMiddleware` logs `duration_us` per request, arrival to end
  of response): nearest-rank p50 / p99 in ms over every call, the task SDK's retries included (it
  retries after its 5 s `execution_api_timeout`); not 2xx: answers like 409 (the task was set FAILED
  meanwhile); the status codes are in live.json.
* deployment: seconds from `airflow db migrate` to the last component stopped.
"""


def _fmt_pct(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.0f}%)" if whole else str(part)


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


#: (row label, value of one cell). A cell with an error shows "error" on every row.
ROWS: list[tuple[str, Callable[[Cell], str]]] = [
    ("producer tasks failed", lambda c: _fmt_pct(c["tasks"]["failed"], c["tasks"]["tasks"])),
    ("producer tasks retried", lambda c: str(c["tasks"]["retried"])),
    ("deadlocks, server counter", _deadlock_server),
    (
        "deadlock lines in logs (components / tasks)",
        lambda c: f"{c['deadlocks']['log_lines_components']} / {c['deadlocks']['log_lines_tasks']}",
    ),
    ("task-success calls answered 5xx", lambda c: str(_server_errors(c))),
    ("asset events written / expected", _events),
    (
        "consumer runs (after the bursts / at the end)",
        lambda c: f"{c['after_bursts']['consumer_runs']} / {c['after_extra']['consumer_runs']}",
    ),
    ("(event, consumer) pairs", lambda c: str(c["after_bursts"]["pairs"])),
    (
        "stranded after the bursts",
        lambda c: _fmt_pct(c["after_bursts"]["stranded"], c["after_bursts"]["pairs"]),
    ),
    (
        "stranded, of the last burst alone",
        lambda c: _fmt_pct(c["after_bursts"]["last_burst_stranded"], c["after_bursts"]["last_burst_pairs"]),
    ),
    (
        "still unconsumed after one more event",
        lambda c: _fmt_pct(c["after_extra"]["stranded"], c["after_extra"]["pairs"]),
    ),
    ("pairs consumed twice", lambda c: str(c["after_extra"]["consumed_twice"])),
    (
        "queue rows left (after the bursts / at the end)",
        lambda c: f"{c['after_bursts']['queue_rows']} / {c['after_extra']['queue_rows']}",
    ),
    ("trigger to done, s (per burst)", _bursts),
    ("PATCH .../state p50 / p99 ms", _latency),
    ("deployment, s", lambda c: f"{c['duration_s']:.0f}"),
]


def _value(cell: Cell, row: Callable[[Cell], str]) -> str:
    if cell.get("error"):
        return "error"
    try:
        return row(cell)
    except (KeyError, TypeError, ZeroDivisionError):
        return "?"


def format_tables(raw: dict[str, Any]) -> str:
    """Markdown: per database a table (rows x managers), then the legend, the problems."""
    sizes = raw["sizes"]
    lines = [
        f"## Live Airflow {raw.get('airflow_version', '?')}: stock AssetManager vs airflow-adrq's plug-in",
        "",
        f"{sizes['producer_dags']} producer DAG(s) x {sizes['instances']} mapped instances x "
        f"{sizes['outlets']} outlets, {sizes['consumers']} consumer DAGs on the OR of the outlets, "
        f"{sizes['bursts']} bursts (a burst's instances finish together, each a random 0 to "
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
        mine = [c for c in cells if c["db"] == db]
        managers = [m for m in MANAGERS if any(c["manager"] == m for c in mine)]
        first = mine[0]
        lines += [
            "",
            f"### {db}: {first['version']}; {shape_label(_shape(first))}",
            "",
            "| | " + " | ".join(managers) + " |",
            "|---|" + "---:|" * len(managers),
        ]
        for label, row in ROWS:
            values = []
            for manager in managers:
                runs = sorted((c for c in mine if c["manager"] == manager), key=lambda c: c["run"])
                values.append("; ".join(_value(c, row) for c in runs))
            lines.append(f"| {label} | " + " | ".join(values) + " |")
        errors = [c for c in mine if c.get("error")]
        for c in errors:
            lines += ["", f"* {c['manager']} run {c['run']} failed: {c['error'].splitlines()[0]}"]
            lines.append(f"  (api-server log: {c.get('api_server_log')})")
    lines += ["", LEGEND]
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
    return ", ".join(parts)


def plugin_policy(cell: Cell) -> str:
    """The ``on_conflict`` the plug-in's start-up line names (``auto`` if it names none)."""
    found = re.search(r"on_conflict=(\w+)", str(cell.get("plugin_start_up") or ""))
    return found.group(1) if found else "auto"


def stranded_allowed(cell: Cell) -> int:
    """Stranded pairs after the bursts that are a note, not a problem (README, "Timing").

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
        f"event, within the {stranded_allowed(c)} on_conflict={plugin_policy(c)} allows here (README, Timing)"
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
    path.write_text(json.dumps(raw, indent=2, sort_keys=False, default=str) + "\n")


def plot(raw: dict[str, Any], path: Path) -> Path | None:
    """One PNG: per database and manager, failed tasks and stranded pairs (%), and PATCH latency."""
    plt = plots.pyplot()
    cells = [c for c in raw["cells"] if not c.get("error")]
    if not cells:
        return None
    groups = list(dict.fromkeys((c["db"], c["manager"]) for c in cells))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    def share(c: Cell, part: float, whole: float) -> float:
        return 100 * part / whole if whole else 0.0

    metrics: list[tuple[str, Callable[[Cell], float]]] = [
        ("producer tasks failed", lambda c: share(c, c["tasks"]["failed"], c["tasks"]["tasks"])),
        (
            "stranded after the bursts",
            lambda c: share(c, c["after_bursts"]["stranded"], c["after_bursts"]["pairs"]),
        ),
        (
            "unconsumed after one more event",
            lambda c: share(c, c["after_extra"]["stranded"], c["after_extra"]["pairs"]),
        ),
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(metrics)
    xs = range(len(groups))
    for k, (label, metric) in enumerate(metrics):
        values = [mean([metric(c) for c in cells if (c["db"], c["manager"]) == g]) for g in groups]
        bars = left.bar([x + (k - (len(metrics) - 1) / 2) * width for x in xs], values, width, label=label)
        left.bar_label(bars, fmt="%.3g", fontsize=7)
    left.set_xticks(list(xs), [f"{db}\n{m}" for db, m in groups])
    left.set_ylabel("% of producer tasks / of (event, consumer) pairs")
    left.set_title("Failures and stranded events")
    left.legend(fontsize=8)
    for k, (label, key) in enumerate((("p50", "p50_ms"), ("p99", "p99_ms"))):
        values = [
            mean(
                [
                    c["patch_state"][key]
                    for c in cells
                    if (c["db"], c["manager"]) == g and c["patch_state"]["calls"]
                ]
            )
            for g in groups
        ]
        bars = right.bar([x + (k - 0.5) * 0.4 for x in xs], values, 0.4, label=label)
        right.bar_label(bars, fmt="%.0f", fontsize=7)
    right.set_xticks(list(xs), [f"{db}\n{m}" for db, m in groups])
    right.set_ylabel("ms")
    right.set_title("PATCH /execution/task-instances/{id}/state (api-server access log)")
    right.legend(fontsize=8)
    sizes = raw["sizes"]
    title = (
        f"airflow-adrq bench --airflow --live: {sizes['producer_dags']} x {sizes['instances']} instances x "
        f"{sizes['outlets']} outlets, {sizes['consumers']} consumers, {sizes['bursts']} bursts"
    )
    return plots.save(fig, title, path, dpi=110)
