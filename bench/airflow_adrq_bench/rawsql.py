"""The raw-SQL reference: one asset event and its queue rows, hand-written, through the DB-API.

What :func:`airflow_adrq.register_asset_change` + COMMIT does for one event of an asset with only direct
consumers, with the same guarantees, as the least a hand-written implementation sends on
``engine.raw_connection()`` (the library's driver), bound parameters: look the asset up, insert the event,
write the queue rows and the stamp as :func:`airflow_adrq.queue.queue_events` does on that backend (the steps
of :func:`raw_sql`), COMMIT. Timed against the library by :func:`airflow_adrq_bench.engine.run_raw_ratio`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.engine import Dialect

from airflow_adrq.models import UtcDateTime, utcnow
from airflow_adrq.refresh import PENDING

_LOOKUP = "SELECT id FROM asset WHERE name = {name} AND uri = {uri}"
_INSERT_EVENT = (
    "INSERT INTO asset_event (asset_id, extra, source_task_id, source_dag_id, source_run_id, "
    "source_map_index, timestamp) VALUES ({asset_id}, {extra}, {task_id}, {dag_id}, {run_id}, "
    "{map_index}, {timestamp})"
)
_QUEUE = (
    "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) "
    "SELECT e.asset_id, r.dag_id, {created_at} FROM asset_event e "
    "JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id "
    "JOIN dag d ON d.dag_id = r.dag_id "
    "WHERE e.id = {event_id} AND e.partition_key IS NULL "
    "AND d.is_paused = {false} AND d.timetable_partitioned = {false} "
    "ORDER BY e.asset_id, r.dag_id"
)
_STAMP_EVENT = "UPDATE asset_event SET timestamp = {now} WHERE id = {event_id}"
_STAMP_ROWS = (
    "UPDATE asset_dag_run_queue SET created_at = {now} WHERE asset_id = {asset_id} AND created_at = {pending}"
)
#: PostgreSQL: the share locks, the clock, the rows and the event in one statement. The consumers are
#: read once; their dag rows by primary key (= ANY of one array) and filtered as locked.
_WRITE_PG = (
    "WITH src AS MATERIALIZED (SELECT e.asset_id, r.dag_id FROM asset_event e "
    "JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id "
    "WHERE e.id = {event_id} AND e.partition_key IS NULL), "
    "locked AS MATERIALIZED (SELECT d.dag_id FROM dag d "
    "WHERE d.dag_id = ANY (CAST((SELECT array_agg(dag_id) FROM src) AS VARCHAR[])) "
    'ORDER BY d.dag_id COLLATE "C" FOR SHARE OF d NOWAIT), '
    "stamp AS MATERIALIZED (SELECT clock_timestamp() AS t FROM (SELECT count(*) FROM locked) AS held), "
    "q AS (INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) "
    "SELECT src.asset_id, src.dag_id, (SELECT t FROM stamp) FROM src JOIN dag d ON d.dag_id = src.dag_id "
    "WHERE d.dag_id = ANY (CAST((SELECT array_agg(dag_id) FROM src) AS VARCHAR[])) "
    "AND NOT d.is_paused AND NOT d.timetable_partitioned ORDER BY src.asset_id, src.dag_id "
    "ON CONFLICT (asset_id, target_dag_id) DO UPDATE SET created_at = "
    "greatest(asset_dag_run_queue.created_at, excluded.created_at) "
    "WHERE asset_dag_run_queue.created_at < excluded.created_at) "
    "UPDATE asset_event SET timestamp = (SELECT t FROM stamp) WHERE id = {event_id} RETURNING timestamp"
)
#: A step that reads the database's clock into ``now`` (MySQL).
_CLOCK = "SELECT UTC_TIMESTAMP(6)"
_CONFLICT: Final = {
    "postgresql": "",  # in _WRITE_PG
    "sqlite": " ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
    "mysql": " ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
}


@dataclass(frozen=True)
class RawSql:
    """The hand-written statements for one dialect, and how to bind a timestamp there."""

    begin: str | None
    lookup: str
    insert_event: str
    returning: bool
    #: Step 3, in order; :data:`_CLOCK` reads the database's clock into ``now`` (else Python's).
    steps: tuple[str, ...]
    timestamp: Callable[[dt.datetime], Any]

    def register(self, dbapi_connection: Any, *, name: str, uri: str, source: Mapping[str, Any]) -> int:
        """One event of the task ``source`` names (``dag_id``, ``task_id``, ``run_id``, ``map_index``) +
        its queue rows + COMMIT; returns the event id."""
        with contextlib.closing(dbapi_connection.cursor()) as cursor:
            try:
                if self.begin:
                    cursor.execute(self.begin)
                cursor.execute(self.lookup, {"name": name, "uri": uri})
                (asset_id,) = cursor.fetchone()
                event = {"asset_id": asset_id, "extra": "{}", "timestamp": self.timestamp(utcnow()), **source}
                cursor.execute(self.insert_event, event)
                event_id = cursor.fetchone()[0] if self.returning else cursor.lastrowid
                params = {"now": self.timestamp(utcnow()), "event_id": event_id, "asset_id": asset_id}
                params["pending"] = self.timestamp(PENDING)
                for step in self.steps:
                    cursor.execute(step, params)
                    if step == _CLOCK:
                        (params["now"],) = cursor.fetchone()
                dbapi_connection.commit()
            except BaseException:
                dbapi_connection.rollback()
                raise
        return int(event_id)


def raw_sql(dialect: Dialect) -> RawSql:
    """The raw-SQL reference for ``dialect`` (PostgreSQL, MySQL/MariaDB or SQLite)."""
    name = dialect.name
    if name not in _CONFLICT:
        raise ValueError(f"no raw-SQL reference for dialect {name!r}")
    # Bound parameters in a mapping: sqlite3 takes :name; psycopg2, psycopg 3, mysqlclient and
    # PyMySQL all take %(name)s.
    form = ":{}" if name == "sqlite" else "%({})s"
    names = "name uri asset_id extra task_id dag_id run_id map_index timestamp now event_id pending"
    p = {n: form.format(n) for n in names.split()}
    # MySQL < 8 has no RETURNING; MariaDB has had it on INSERT since 10.5.
    returning = name != "mysql" or bool(getattr(dialect, "is_mariadb", False))
    false = "false" if name == "postgresql" else "0"
    queue = _QUEUE.replace("{created_at}", "{pending}" if name == "mysql" else "{now}") + _CONFLICT[name]
    queue = queue.format(false=false, **p)
    steps = {
        "postgresql": ("SAVEPOINT adrq_share_lock", _WRITE_PG.format(**p)),
        "mysql": (queue, _CLOCK, _STAMP_EVENT.format(**p), _STAMP_ROWS.format(**p)),
        "sqlite": (_STAMP_EVENT.format(**p), queue),
    }[name]
    begin = "BEGIN IMMEDIATE" if name == "sqlite" else None
    insert_event = _INSERT_EVENT.format(**p) + (" RETURNING id" if returning else "")
    timestamp = UtcDateTime().dialect_impl(dialect).bind_processor(dialect) or (lambda value: value)
    return RawSql(begin, _LOOKUP.format(**p), insert_event, returning, steps, timestamp)
