"""What the live run counts: plain SQL on the scratch database (the controller never imports
Airflow), the server's deadlock counter, and the components' logs. What each count means is the
live legend's (``legends.md``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.databases import fetch, latest_deadlock
from airflow_adrq_bench.stats import percentile

#: A line that reports a deadlock: PostgreSQL's message and SQLSTATE, MySQL/MariaDB's message and errno.
DEADLOCK_LINE: Final = re.compile(r"deadlock detected|Deadlock found|40P01|\(1213,", re.IGNORECASE)
TERMINAL_RUN_STATES: Final = ("success", "failed")

# ``SELECT key, count(*) ... GROUP BY key`` of the runs, task instances and events :func:`counts` reads.
_WHERE = "WHERE dag_id IN :dag_ids AND run_id IN :run_ids GROUP BY"
RUN_STATES: Final = f"SELECT state, count(*) FROM dag_run {_WHERE} state"
TASK_STATES: Final = f"SELECT state, count(*) FROM task_instance {_WHERE} state"
EVENTS: Final = (
    "SELECT source_run_id, count(*) FROM asset_event "
    "WHERE source_dag_id IN :dag_ids AND source_run_id IN :run_ids GROUP BY source_run_id"
)

# Per (event of a burst run, consumer DAG scheduled on its asset): the runs of that DAG that consumed it.
_PAIRS = """
SELECT e.asset_id, e.source_run_id, r.dag_id, count(d.id) FROM asset_event e
JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id AND r.dag_id IN :consumers
LEFT JOIN (dagrun_asset_event x JOIN dag_run d ON d.id = x.dag_run_id)
  ON x.event_id = e.id AND d.dag_id = r.dag_id
WHERE e.source_dag_id IN :producers AND e.source_run_id IN :run_ids
GROUP BY e.id, e.asset_id, e.source_run_id, r.dag_id
"""


def counts(conn: sa.Connection, sql: str, **params: Any) -> dict[str, int]:
    """``{key: count}`` of a ``SELECT key, count(*)`` (a NULL key is ``"none"``)."""
    return {str(key or "none"): int(n) for key, n in fetch(conn, sql, **params)}


def run_count(conn: sa.Connection, dag_ids: Sequence[str]) -> int:
    """Runs of these DAGs."""
    return int(fetch(conn, "SELECT count(*) FROM dag_run WHERE dag_id IN :ids", ids=list(dag_ids))[0][0])


def producer_tasks(
    conn: sa.Connection, dag_ids: Sequence[str], run_ids: Sequence[str]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """The producer task instances of the burst runs: failed / retried / succeeded overall; the same per
    burst, with its tasks' last ``end_date`` and their spread; and each one's burst by its id."""
    rows = fetch(
        conn,
        "SELECT id, run_id, state, try_number, end_date FROM task_instance "
        "WHERE dag_id IN :dag_ids AND run_id IN :run_ids",
        dag_ids=list(dag_ids),
        run_ids=list(run_ids),
    )

    def tally(mine: Sequence[tuple[Any, ...]]) -> dict[str, int]:
        failed = sum(1 for _, _, state, _, _ in mine if state == "failed")
        retried = sum(1 for *_, tries, _ in mine if (tries or 0) > 1)
        return {"tasks": len(mine), "failed": failed, "retried": retried}

    bursts = []
    for run_id in run_ids:
        mine = [r for r in rows if r[1] == run_id]
        ends = sorted(_utc(end) for *_, end in mine if end is not None)
        # end_spread_s: how close together the success calls finished (they set end_date).
        spread = (ends[-1] - ends[0]).total_seconds() if ends else None
        last = ends[-1].isoformat() if ends else None
        bursts.append({"run_id": run_id, **tally(mine), "last_end": last, "end_spread_s": spread})
    states = Counter(str(state or "none") for _, _, state, _, _ in rows)
    other = {k: n for k, n in states.items() if k not in ("success", "failed")}
    overall = {**tally(rows), "succeeded": states["success"], "other": other}
    return overall, bursts, {_uuid_hex(ti_id): str(run_id) for ti_id, run_id, *_ in rows}


def count_pairs(
    conn: sa.Connection,
    producers: Sequence[str],
    consumers: Sequence[str],
    run_ids: Sequence[str],
    waiting: frozenset[tuple[int, str]],
) -> dict[str, int]:
    """The (event, consumer) pairs of the burst runs' events: how many, how many no run consumed
    (``stranded``; also of the last burst alone), how many two or more runs of the DAG did, and how
    many are ``waiting``: unconsumed, of the queue rows ``waiting`` (all-of consumers missing an asset)."""
    params = {"producers": list(producers), "consumers": list(consumers), "run_ids": list(run_ids)}
    keys = ("pairs", "stranded", "consumed_twice", "last_burst_pairs", "last_burst_stranded", "waiting")
    out = dict.fromkeys(keys, 0)
    for asset_id, run_id, dag_id, runs in fetch(conn, _PAIRS, **params):
        out["pairs"] += 1
        if runs == 0 and (int(asset_id), str(dag_id)) in waiting:
            out["waiting"] += 1
            continue
        out["stranded"] += runs == 0
        out["consumed_twice"] += runs > 1
        if run_id == run_ids[-1]:
            out["last_burst_pairs"] += 1
            out["last_burst_stranded"] += runs == 0
    return out


def deadlock_counter(conn: sa.Connection, database: str) -> dict[str, Any]:
    """The server's deadlock counter now: PostgreSQL's of ``database``; MySQL/MariaDB's of the whole
    server, with whether InnoDB's latest detected deadlock names ``database`` (None: unreadable)."""
    if conn.dialect.name == "postgresql":
        # A fresh snapshot: the statistics are cached per transaction by default.
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        value = fetch(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = :name", name=database)
        return {"value": int(value[0][0] or 0), "scope": "database", "latest_names_database": None}
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).first()
    section, spellings = latest_deadlock(conn), (f"`{database}`", f" {database}.", f"`{database}/")
    names = None if section is None else any(n in section for n in spellings)
    return {"value": int(row[1]) if row else 0, "scope": "server", "latest_names_database": names}


def deadlocks(
    before: dict[str, Any], after: dict[str, Any], logs: Iterable[Path], task_logs: Iterable[Path]
) -> dict[str, Any]:
    """The server counter's difference, and the deadlock lines in the components' and the tasks' logs."""
    in_components, in_tasks = deadlock_lines(sorted(logs)), deadlock_lines(sorted(task_logs))
    return {
        "server": after["value"] - before["value"],
        "server_scope": after["scope"],
        "latest_names_database": after["latest_names_database"],
        "log_lines_components": sum(in_components.values()),
        "log_lines_tasks": sum(in_tasks.values()),
        "log_files": {**in_components, **in_tasks},
    }


def deadlock_lines(paths: Iterable[Path]) -> dict[str, int]:
    """Lines matching :data:`DEADLOCK_LINE` per file (files without any left out)."""
    found = {}
    for path in paths:
        with path.open(errors="replace") as lines:
            found[str(path)] = sum(1 for line in lines if DEADLOCK_LINE.search(line))
    return {path: n for path, n in found.items() if n}


def plugin_line(api_server_log: Path) -> str | None:
    """The plug-in's start-up line in the api-server's log (names its on_conflict policy), if any."""
    with api_server_log.open(errors="replace") as lines:
        for line in lines:
            if "airflow-adrq: " in line and "on_conflict=" in line:
                return line.split("airflow-adrq: ", 1)[1].split(" [", 1)[0].strip()
    return None


# A task-state call's ``request finished`` line of the api-server's access log (Airflow 3.3's
# HttpAccessLogMiddleware: duration_us from the request's arrival to the end of its response);
# structlog prints the fields sorted by name.
_STATE_CALL = re.compile(
    r"^(?P<at>\S+) .*request finished.* duration_us=(?P<us>\d+) .*method=PATCH "
    r"path=/execution/task-instances/(?P<ti>[0-9a-fA-F-]{32,36})/state .*status_code=(?P<status>\d+)"
)


@dataclass(frozen=True)
class AccessRecord:
    """One ``PATCH /execution/task-instances/{id}/state`` line of the access log; ``at``: when it
    was logged (the response sent), from the line's leading timestamp."""

    ti_id: str
    status: int
    duration_ms: float
    at: dt.datetime | None = None


def parse_access_log(path: Path) -> list[AccessRecord]:
    """The task-state calls in the api-server's log (its ``request finished`` lines)."""
    with path.open(errors="replace") as lines:
        found = [m for m in map(_STATE_CALL.match, lines) if m]
    return [
        AccessRecord(_uuid_hex(m["ti"]), int(m["status"]), int(m["us"]) / 1000, _at(m["at"])) for m in found
    ]


def state_calls(
    api_server_log: Path, bursts: Sequence[dict[str, Any]], run_of: dict[str, str]
) -> dict[str, Any]:
    """The producer tasks' success calls (``run_of``: their burst by task instance id) from the access
    log: their latency, and per burst when its last one was answered, which is when it is done (a
    task's ``end_date`` is the task SDK's, stamped before that call)."""
    records = parse_access_log(api_server_log)
    for burst in bursts:
        ends = [r.at for r in records if r.at is not None and run_of.get(r.ti_id) == burst["run_id"]]
        burst["last_state_call_at"] = max(ends).isoformat() if ends else None
        burst["trigger_to_done_s"] = _seconds(burst["triggered_at"], burst["last_state_call_at"])
        burst["trigger_to_end_date_s"] = _seconds(burst["triggered_at"], burst["last_end"])
    return {"patch_state": latency_summary(records, run_of), "patch_state_all_calls": len(records)}


def latency_summary(records: Sequence[AccessRecord], ti_ids: Iterable[str]) -> dict[str, Any]:
    """p25 / p50 / p75 / p99 / max (ms, nearest rank) and the status codes of these task instances' calls."""
    wanted = set(ti_ids)
    mine = [r for r in records if r.ti_id in wanted]
    durations = sorted(r.duration_ms for r in mine)
    return {
        "calls": len(mine),
        **{f"p{q}_ms": percentile(durations, q) for q in (25, 50, 75, 99)},
        "max_ms": durations[-1] if durations else math.nan,
        "status": dict(sorted(Counter(str(r.status) for r in mine).items())),
    }


def _uuid_hex(value: object) -> str:
    """A UUID in one spelling (32 hex digits): PostgreSQL returns it dashed, MySQL as CHAR(32)."""
    return uuid.UUID(str(value)).hex


def _at(stamp: str) -> dt.datetime | None:
    """The ISO timestamp a structlog console line starts with (``2026-01-01T00:00:00.123456Z``)."""
    with contextlib.suppress(ValueError):
        return _utc(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")))
    return None


def _utc(value: dt.datetime) -> dt.datetime:
    """A timestamp as an aware UTC datetime (MySQL's come back naive, in UTC)."""
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _seconds(start: str, end: str | None) -> float | None:
    """Seconds from ISO timestamp ``start`` to ``end`` (None without an end)."""
    span = None if end is None else dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)
    return None if span is None else round(span.total_seconds(), 2)
