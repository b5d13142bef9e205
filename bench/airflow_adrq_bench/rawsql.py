"""The raw-SQL reference: one asset event and its queue rows, hand-written, through the DB-API.

What :func:`airflow_adrq.register_asset_change` + COMMIT does for one event
of an asset with only direct consumers, with the same guarantees, as the
least a hand-written implementation has to send, on a connection from
``engine.raw_connection()`` (the same driver the library uses), with bound
parameters:

1. ``SELECT id FROM asset WHERE name = :name AND uri = :uri``;
2. ``INSERT INTO asset_event ... RETURNING id`` (PostgreSQL, SQLite,
   MariaDB; MySQL: ``cursor.lastrowid``);
3. ``INSERT INTO asset_dag_run_queue ... SELECT ... FROM asset_event JOIN
   dag_schedule_asset_reference ... JOIN dag ... WHERE asset_event.id = :id
   ... ORDER BY asset_id, dag_id`` with the dialect's conflict clause and
   ``created_at = :pending``: the rows are locked first...
4. ...then stamped, the event and its rows with one value of the database's
   clock (:func:`airflow_adrq.queue.queue_events`' two steps): PostgreSQL
   ``WITH e AS (UPDATE asset_event ...), q AS (UPDATE asset_dag_run_queue
   ...) SELECT statement_timestamp()``; MySQL ``SELECT UTC_TIMESTAMP(6)`` and
   the two UPDATEs; SQLite Python's clock and the two UPDATEs;
5. COMMIT (SQLite: after ``BEGIN IMMEDIATE``, as the library's engine does).

The benchmark times this against the library call by call, interleaved, in
one run (:func:`airflow_adrq_bench.engine.run_raw_ratio`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
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
    "SELECT e.asset_id, r.dag_id, {pending} FROM asset_event e "
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
#: PostgreSQL: both UPDATEs and the clock in one statement.
_STAMP_PG = (
    "WITH e AS (UPDATE asset_event SET timestamp = statement_timestamp() WHERE id = {event_id}), "
    "q AS (UPDATE asset_dag_run_queue SET created_at = statement_timestamp() "
    "WHERE asset_id = {asset_id} AND created_at = {pending}) SELECT statement_timestamp()"
)
_CONFLICT: Final = {
    "postgresql": " ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
    "sqlite": " ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
    "mysql": " ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
}


def _placeholders(dialect_name: str, names: str) -> dict[str, str]:
    """The placeholder of each of the space-separated ``names``, for bound parameters in a mapping."""
    # sqlite3 takes :name with a mapping; psycopg2, psycopg 3, mysqlclient and
    # PyMySQL all take %(name)s with a mapping.
    form = ":{}" if dialect_name == "sqlite" else "%({})s"
    return {n: form.format(n) for n in names.split()}


@dataclass(frozen=True)
class RawSql:
    """The hand-written statements for one dialect, and how to bind a timestamp there."""

    dialect: str
    begin: str | None
    lookup: str
    insert_event: str
    returning: bool
    queue: str
    #: Step 4: the statements that stamp, in order (a ``{now}`` one needs ``clock`` first).
    stamp: tuple[str, ...]
    #: The database's clock as a statement (MySQL), or ``None``: in the stamp (PostgreSQL) or Python's.
    clock: str | None
    timestamp: Callable[[dt.datetime], Any]

    @property
    def statements(self) -> int:
        """Statements sent per call, COMMIT not counted (as ``airflow_adrq_testing.recording`` counts)."""
        return 3 + (self.clock is not None) + len(self.stamp)

    def register(
        self, dbapi_connection: Any, *, name: str, uri: str, source: tuple[str, str, str, int]
    ) -> int:
        """One event + its queue rows + COMMIT; returns the event id."""
        dag_id, task_id, run_id, map_index = source
        cursor = dbapi_connection.cursor()
        try:
            if self.begin:
                cursor.execute(self.begin)
            cursor.execute(self.lookup, {"name": name, "uri": uri})
            (asset_id,) = cursor.fetchone()
            event = {
                "asset_id": asset_id,
                "extra": "{}",
                "task_id": task_id,
                "dag_id": dag_id,
                "run_id": run_id,
                "map_index": map_index,
                "timestamp": self.timestamp(utcnow()),
            }
            cursor.execute(self.insert_event, event)
            if self.returning:
                (event_id,) = cursor.fetchone()
            else:
                event_id = cursor.lastrowid
            pending = self.timestamp(PENDING)
            cursor.execute(self.queue, {"pending": pending, "event_id": event_id})
            if self.clock is not None:
                cursor.execute(self.clock)
                (now,) = cursor.fetchone()
            else:
                now = self.timestamp(utcnow())
            for statement in self.stamp:
                cursor.execute(
                    statement, {"now": now, "event_id": event_id, "asset_id": asset_id, "pending": pending}
                )
            dbapi_connection.commit()
            return int(event_id)
        except BaseException:
            dbapi_connection.rollback()
            raise
        finally:
            cursor.close()


def raw_sql(dialect: Dialect) -> RawSql:
    """The raw-SQL reference for ``dialect`` (PostgreSQL, MySQL/MariaDB or SQLite)."""
    name = dialect.name
    if name not in _CONFLICT:
        raise ValueError(f"no raw-SQL reference for dialect {name!r}")
    p = _placeholders(
        name, "name uri asset_id extra task_id dag_id run_id map_index timestamp now event_id pending"
    )
    # MySQL < 8 has no RETURNING; MariaDB has had it on INSERT since 10.5.
    returning = name != "mysql" or bool(getattr(dialect, "is_mariadb", False))
    insert_event = _INSERT_EVENT.format(**p) + (" RETURNING id" if returning else "")
    false = "false" if name == "postgresql" else "0"
    bind = UtcDateTime().dialect_impl(dialect).bind_processor(dialect)

    def timestamp(value: dt.datetime) -> Any:
        return bind(value) if bind is not None else value

    stamp = (
        (_STAMP_PG.format(**p),)
        if name == "postgresql"
        else (_STAMP_EVENT.format(**p), _STAMP_ROWS.format(**p))
    )
    return RawSql(
        dialect=name,
        begin="BEGIN IMMEDIATE" if name == "sqlite" else None,
        lookup=_LOOKUP.format(**p),
        insert_event=insert_event,
        returning=returning,
        queue=_QUEUE.format(false=false, **p) + _CONFLICT[name],
        stamp=stamp,
        clock="SELECT UTC_TIMESTAMP(6)" if name == "mysql" else None,
        timestamp=timestamp,
    )
