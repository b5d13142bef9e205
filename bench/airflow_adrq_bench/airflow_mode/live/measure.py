"""What the live run counts: SQL on the scratch database, the server's deadlock counters, the logs.

Plain SQL (:func:`.databases.fetch`), never Airflow's models: the controller
does not import Airflow. The definitions (see also the report's legend):

* an *(event, consumer) pair* is an ``asset_event`` row written by a producer
  DAG's burst run times a consumer DAG scheduled on its asset
  (``dag_schedule_asset_reference``);
* a pair is *consumed* when ``dagrun_asset_event`` links the event to a run of
  that consumer DAG; consumed by two or more runs of that DAG, it is *consumed
  twice*; consumed by none, *stranded*;
* *deadlocks*: PostgreSQL's ``pg_stat_database.deadlocks`` of the scratch
  database (only the deployment connects to it); MariaDB/MySQL's
  ``Innodb_deadlocks`` (the whole server, so :func:`deadlock_counter` also
  reports whether InnoDB's latest detected deadlock names the scratch
  database) -- plus the deadlock lines in the components' and tasks' logs;
* the *task-success latency*: the api-server's own access log
  (``HttpAccessLogMiddleware``, Airflow 3.3: one ``request finished`` line per
  request with ``duration_us``, from the request's arrival to the end of its
  response) for ``PATCH /execution/task-instances/{id}/state``, limited to
  the producer task instances of the bursts.
"""

from __future__ import annotations

import dataclasses
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

__all__ = [
    "CONSUMER_RUN_STATES",
    "DEADLOCK_LINE",
    "EVENTS",
    "RUN_STATES",
    "TASK_STATES",
    "TERMINAL_RUN_STATES",
    "AccessRecord",
    "Pairs",
    "ProducerTask",
    "count_pairs",
    "counts",
    "deadlock_counter",
    "deadlock_lines",
    "latency_summary",
    "parse_access_log",
    "producer_tasks",
    "run_count",
    "task_summary",
    "uuid_hex",
]

#: A line that reports a deadlock: PostgreSQL's message and SQLSTATE, MySQL/MariaDB's message and errno.
DEADLOCK_LINE: Final = re.compile(r"deadlock detected|Deadlock found|40P01|\(1213,", re.IGNORECASE)
TERMINAL_RUN_STATES: Final = ("success", "failed")

# ``SELECT key, count(*) ... GROUP BY key`` of the runs and task instances :func:`counts` reads.
RUN_STATES: Final = (
    "SELECT state, count(*) FROM dag_run WHERE dag_id IN :dag_ids AND run_id IN :run_ids GROUP BY state"
)
TASK_STATES: Final = (
    "SELECT state, count(*) FROM task_instance WHERE dag_id IN :dag_ids AND run_id IN :run_ids GROUP BY state"
)
EVENTS: Final = (
    "SELECT source_run_id, count(*) FROM asset_event "
    "WHERE source_dag_id IN :dag_ids AND source_run_id IN :run_ids GROUP BY source_run_id"
)
CONSUMER_RUN_STATES: Final = "SELECT state, count(*) FROM dag_run WHERE dag_id IN :dag_ids GROUP BY state"


def counts(conn: sa.Connection, sql: str, **params: Any) -> dict[str, int]:
    """``{key: count}`` of a ``SELECT key, count(*)`` (a NULL key is ``"none"``)."""
    return {str(key or "none"): int(n) for key, n in fetch(conn, sql, **params)}


def run_count(conn: sa.Connection, dag_ids: Sequence[str]) -> int:
    """Runs of these DAGs."""
    return int(
        fetch(conn, "SELECT count(*) FROM dag_run WHERE dag_id IN :dag_ids", dag_ids=list(dag_ids))[0][0]
    )


@dataclass(frozen=True)
class ProducerTask:
    """One producer task instance as the database has it after the bursts."""

    id: str
    dag_id: str
    run_id: str
    map_index: int
    state: str
    try_number: int
    end_date: dt.datetime | None


def producer_tasks(conn: sa.Connection, dag_ids: Sequence[str], run_ids: Sequence[str]) -> list[ProducerTask]:
    """Every task instance of the producer DAGs' burst runs."""
    sql = (
        "SELECT id, dag_id, run_id, map_index, state, try_number, end_date FROM task_instance "
        "WHERE dag_id IN :dag_ids AND run_id IN :run_ids"
    )
    return [
        ProducerTask(uuid_hex(i), str(d), str(r), int(m), str(s or "none"), int(t or 0), _utc(e))
        for i, d, r, m, s, t, e in fetch(conn, sql, dag_ids=list(dag_ids), run_ids=list(run_ids))
    ]


def task_summary(tasks: Sequence[ProducerTask], run_ids: Sequence[str]) -> dict[str, Any]:
    """Failed / retried / succeeded producer tasks, overall and per burst, and each burst's finish."""

    def tally(mine: Sequence[ProducerTask]) -> dict[str, int]:
        failed = sum(1 for t in mine if t.state == "failed")
        return {"tasks": len(mine), "failed": failed, "retried": sum(1 for t in mine if t.try_number > 1)}

    per_burst = []
    for run_id in run_ids:
        mine = [t for t in tasks if t.run_id == run_id]
        ends = [t.end_date for t in mine if t.end_date is not None]
        per_burst.append(
            {
                "run_id": run_id,
                **tally(mine),
                "last_end": max(ends).isoformat() if ends else None,
                # How close together the success calls finished (end_date is set by them).
                "end_spread_s": (max(ends) - min(ends)).total_seconds() if ends else None,
            }
        )
    return {
        **tally(tasks),
        "succeeded": sum(1 for t in tasks if t.state == "success"),
        "other": dict(Counter(t.state for t in tasks if t.state not in ("success", "failed"))),
        "bursts": per_burst,
    }


@dataclass(frozen=True)
class Pairs:
    """The (event, consumer) pairs of the producers' events and how many runs consumed each."""

    pairs: int
    stranded: int
    consumed_twice: int
    last_burst_pairs: int
    last_burst_stranded: int
    #: Unconsumed pairs whose (asset, consumer) row waits for the consumer's other assets
    #: (``a0 & a1 & ...``): not stranded, consumed once every asset has an event.
    waiting: int = 0

    def as_dict(self) -> dict[str, int]:
        """The JSON form."""
        return dataclasses.asdict(self)


def count_pairs(
    conn: sa.Connection,
    producers: Sequence[str],
    consumers: Sequence[str],
    run_ids: Sequence[str],
    waiting: frozenset[tuple[int, str]] = frozenset(),
) -> Pairs:
    """Count the pairs of the burst runs' events (see the module docstring).

    ``waiting``: the (asset id, consumer) queue rows of all-of consumers still
    missing an asset; their unconsumed pairs count as ``waiting``, not stranded.

    Three reads joined here rather than in SQL: a join of every event with every
    consumer and every consuming run would be events x consumers x runs rows.
    """
    events = fetch(
        conn,
        "SELECT id, asset_id, source_run_id FROM asset_event WHERE source_dag_id IN :dag_ids "
        "AND source_run_id IN :run_ids",
        dag_ids=list(producers),
        run_ids=list(run_ids),
    )
    references = fetch(
        conn,
        "SELECT asset_id, dag_id FROM dag_schedule_asset_reference WHERE dag_id IN :d",
        d=list(consumers),
    )
    consumed = fetch(
        conn,
        "SELECT x.event_id, d.dag_id FROM dagrun_asset_event x JOIN dag_run d ON d.id = x.dag_run_id "
        "WHERE d.dag_id IN :d",
        d=list(consumers),
    )
    runs_of: Counter[tuple[int, str]] = Counter((int(e), str(d)) for e, d in consumed)
    consumers_of: dict[int, list[str]] = {}
    for asset_id, dag_id in references:
        consumers_of.setdefault(int(asset_id), []).append(str(dag_id))
    last = run_ids[-1] if run_ids else None
    pairs = stranded = twice = last_pairs = last_stranded = waits = 0
    for event_id, asset_id, run_id in events:
        for dag_id in consumers_of.get(int(asset_id), ()):
            n = runs_of[(int(event_id), dag_id)]
            pairs += 1
            if n == 0 and (int(asset_id), dag_id) in waiting:
                waits += 1
                continue
            stranded += n == 0
            twice += n > 1
            if run_id == last:
                last_pairs += 1
                last_stranded += n == 0
    return Pairs(pairs, stranded, twice, last_pairs, last_stranded, waits)


def deadlock_counter(conn: sa.Connection, database: str) -> dict[str, Any]:
    """The server's deadlock counter now: ``{"value", "scope", "latest_names_database"}``.

    PostgreSQL: ``pg_stat_database.deadlocks`` of ``database`` (exact: only the
    deployment uses the scratch database). MySQL/MariaDB: ``Innodb_deadlocks``
    of the whole server, and whether InnoDB's latest detected deadlock names
    ``database`` (None when that cannot be read).
    """
    if conn.dialect.name == "postgresql":
        # A fresh snapshot: the statistics are cached per transaction by default.
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        value = fetch(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = :name", name=database)
        return {
            "value": int(value[0][0] or 0) if value else 0,
            "scope": "database",
            "latest_names_database": None,
        }
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE :name"), {"name": "Innodb_deadlocks"}).first()
    section = latest_deadlock(conn)
    names = (
        None
        if section is None
        else any(n in section for n in (f"`{database}`", f" {database}.", f"`{database}/"))
    )
    return {"value": int(row[1]) if row else 0, "scope": "server", "latest_names_database": names}


def deadlock_lines(paths: Iterable[Path]) -> dict[str, int]:
    """Lines matching :data:`DEADLOCK_LINE` per file (files without any left out)."""
    found: dict[str, int] = {}
    for path in paths:
        try:
            with path.open(errors="replace") as handle:
                n = sum(1 for line in handle if DEADLOCK_LINE.search(line))
        except OSError:
            continue
        if n:
            found[str(path)] = n
    return found


_FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)")
_STATE_PATH = re.compile(r"/execution/task-instances/([0-9a-fA-F-]{32,36})/state")


@dataclass(frozen=True)
class AccessRecord:
    """One ``PATCH /execution/task-instances/{id}/state`` line of the access log."""

    ti_id: str
    status: int
    duration_ms: float
    #: When the line was logged (the response was sent), from the line's leading timestamp.
    at: dt.datetime | None = None


def parse_access_log(path: Path) -> list[AccessRecord]:
    """The task-state calls in the api-server's log (its ``request finished`` lines)."""
    records = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        if "request finished" not in line or "PATCH" not in line:
            continue
        fields = {k: v.strip("'\"") for k, v in _FIELD.findall(line)}
        match = _STATE_PATH.fullmatch(fields.get("path", ""))
        if fields.get("method") != "PATCH" or not match or "duration_us" not in fields:
            continue
        try:
            status, duration = int(fields.get("status_code", 0)), int(fields["duration_us"]) / 1000
        except ValueError:
            continue
        records.append(AccessRecord(uuid_hex(match.group(1)), status, duration, _line_time(line)))
    return records


def latency_summary(records: Sequence[AccessRecord], ti_ids: Iterable[str]) -> dict[str, Any]:
    """p50 / p99 / max (ms, nearest rank) and status codes of the calls of these task instances."""
    wanted = set(ti_ids)
    mine = [r for r in records if r.ti_id in wanted]
    durations = sorted(r.duration_ms for r in mine)
    return {
        "calls": len(mine),
        "p50_ms": percentile(durations, 50),
        "p99_ms": percentile(durations, 99),
        "max_ms": durations[-1] if durations else math.nan,
        "status": dict(sorted(Counter(str(r.status) for r in mine).items())),
    }


def uuid_hex(value: object) -> str:
    """A UUID in one spelling (32 hex digits): PostgreSQL returns it dashed, MySQL as CHAR(32)."""
    return uuid.UUID(str(value)).hex


def _line_time(line: str) -> dt.datetime | None:
    """The ISO timestamp a structlog console line starts with (``2026-01-01T00:00:00.123456Z``)."""
    try:
        return _utc(dt.datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")))
    except ValueError:
        return None


def _utc(value: object) -> dt.datetime | None:
    """A timestamp as an aware UTC datetime (MySQL's come back naive, in UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise TypeError(f"not a timestamp: {value!r}")
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
