"""MySQL 8 / MariaDB (InnoDB): the queue write (:func:`write`), ``INSERT ... ON DUPLICATE KEY UPDATE``.

Where Airflow's scheduler takes no row locks (MariaDB, whose dialect has no ``FOR UPDATE OF``) the
write is :mod:`airflow_adrq.refresh`'s instead (``"auto"`` resolves to ``"refresh_after_commit"``).

Never ``INSERT IGNORE``: it takes a *shared* lock on a duplicate row, which deadlocks against a
consumer deleting that row (shared-to-exclusive upgrade), and it downgrades FK / NOT NULL errors to
warnings. The no-op ODKU takes an exclusive record lock on the duplicate instead, held until commit;
so the statement first skips rows that already exist (a ``NOT EXISTS`` probe), and ODKU only
settles two producers inserting the same new row.

READ COMMITTED (as Airflow configures MySQL) makes the SELECT half, and that probe, a consistent
read: only the inserted/duplicate ADRQ rows and the FK parent records are locked. Under REPEATABLE
READ or SERIALIZABLE, ``INSERT ... SELECT`` takes shared next-key locks on every row it reads
(reference tables, ``asset``, ``dag``), which conflict with the DAG processor and the scheduler: the
first queue write on such a connection raises :class:`~airflow_adrq.errors.IsolationLevelError`,
unless the connection (or its engine) carries ``engine.execution_options(adrq_allow_isolation=True)``:
the caller then accepts those locks. The level is read once per DBAPI connection (again when the
``isolation_level`` execution option changes); a raw ``SET SESSION TRANSACTION ISOLATION LEVEL`` on
a pooled connection is not noticed.

SQLAlchemy renders ``VALUES(col)`` (not MySQL 8.0.20's row alias) for ``INSERT ... SELECT``; both
MySQL 8 and MariaDB accept it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Column, ColumnElement, Select, Table, bindparam, exists, func, select
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, CursorResult, Engine
from sqlalchemy.sql.dml import Insert

from airflow_adrq import queue, statement, tables
from airflow_adrq.dialects import ConflictMode
from airflow_adrq.errors import AdrqError, IsolationLevelError
from airflow_adrq.metrics import Metrics
from airflow_adrq.statement import Form
from airflow_adrq.tables import UtcDateTime

#: Execution option that lets a connection write the queue at any isolation level.
ALLOW_ISOLATION_OPTION = "adrq_allow_isolation"

# Levels under which INSERT ... SELECT reads without next-key locks.
_LOCK_FREE_READS = frozenset({"READ COMMITTED", "READ UNCOMMITTED", "AUTOCOMMIT"})
_LEVEL_KEY = "airflow_adrq.isolation_level"


def insert_from_select(
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
    """``INSERT ... SELECT ... WHERE NOT EXISTS (<a row needing no write>) ON DUPLICATE KEY UPDATE``."""
    # Skip the rows that need no write instead of "updating" them: the no-op ODKU's exclusive lock on
    # an existing row and Airflow's scheduler deleting rows DAG by DAG in Python-set order lock the
    # same rows in opposite orders (measured: the producer was the victim, 23-42 deadlocks per 240
    # transactions). "ignore" skips every existing row; "refresh" only those already at least as
    # new, and locks the older ones it must move forwards. Two producers inserting the same new row:
    # the second waits, then skips or refreshes.
    picked = dict(zip([column.name for column in columns], select.selected_columns, strict=True))
    same_key = [table.c[k] == picked[k] for k in key]
    if on_conflict == "refresh":
        same_key.append(table.c[refresh] >= picked[refresh])
    select = select.where(~exists().where(*same_key))
    stmt = mysql.insert(table).from_select(list(columns), select)
    if on_conflict == "ignore":
        return stmt.on_duplicate_key_update({key[0]: table.c[key[0]]})
    return stmt.on_duplicate_key_update({refresh: func.greatest(table.c[refresh], stmt.inserted[refresh])})


def check_connection(connection: Connection) -> None:
    """:class:`IsolationLevelError` unless READ COMMITTED (or allowed): cached per DBAPI connection."""
    options = connection.get_execution_options()
    if options.get(ALLOW_ISOLATION_OPTION):
        return
    # Per DBAPI connection (the pool record's info survives checkouts); keyed by the isolation_level
    # option, which SQLAlchemy resets on check-in.
    info = connection.connection.info
    requested = options.get("isolation_level")
    cached = info.get(_LEVEL_KEY)
    if cached is None or cached[0] != requested:
        cached = info[_LEVEL_KEY] = (requested, connection.get_isolation_level())
    if (level := cached[1]) not in _LOCK_FREE_READS:
        raise IsolationLevelError(
            f"this MySQL/MariaDB connection runs at {level}: INSERT ... SELECT would take shared "
            "next-key locks on the reference, asset and dag rows it reads. Use READ COMMITTED "
            "(airflow_adrq.create_engine and Airflow both do), or accept those locks with "
            f"engine.execution_options({ALLOW_ISOLATION_OPTION}=True)."
        )


def insert_ignore(table: Table) -> Insert:
    """``INSERT ... ON DUPLICATE KEY UPDATE <first key column> = itself``: never ``INSERT IGNORE``."""
    first = next(iter(table.primary_key.columns))
    return mysql.insert(table).on_duplicate_key_update({first.name: first})


def check_before_ddl(connection: Connection) -> None:
    """Refuse a server that would give ``TIMESTAMP NOT NULL`` columns implicit defaults."""
    # Off, the server gives the first TIMESTAMP NOT NULL column of a table DEFAULT CURRENT_TIMESTAMP
    # ON UPDATE CURRENT_TIMESTAMP, so asset_dag_run_queue.created_at would move on every UPDATE of
    # its row (Airflow refuses such servers too). On by default since MySQL 8.0 and MariaDB 10.10.
    value = connection.exec_driver_sql("SELECT @@SESSION.explicit_defaults_for_timestamp").scalar()
    if not value:
        raise AdrqError(
            "airflow-adrq migrations need explicit_defaults_for_timestamp=ON on MySQL/MariaDB "
            "(set it in the server configuration); otherwise TIMESTAMP NOT NULL columns get an "
            "implicit DEFAULT/ON UPDATE CURRENT_TIMESTAMP. Nothing was changed."
        )


name = "mysql"
#: As Airflow forces on MySQL (settings.prepare_engine_args).
engine_kwargs: Mapping[str, Any] = {"isolation_level": "READ COMMITTED"}
driver_extra: str | None = "mysql"
stamp_in_one_statement = False
transactional_ddl = False


def clock() -> ColumnElement[dt.datetime]:
    """UTC wall time, as the naive UTC values sent for TIMESTAMP columns (``UtcDateTime``); per statement."""
    return func.utc_timestamp(6, type_=UtcDateTime())


def configure_engine(engine: Engine) -> None:
    """Nothing beyond :data:`engine_kwargs`."""


def refresh_by_default(connection: Connection) -> bool:
    """MySQL 8's scheduler locks the rows it consumes: refresh waits for it. MariaDB's does not, and
    deletes DAG by DAG: refresh would deadlock. (Airflow's with_row_locks adds FOR UPDATE ... SKIP
    LOCKED only where the dialect supports FOR UPDATE OF: MySQL 8; not MariaDB, MDEV-13115.)"""
    return bool(getattr(connection.dialect, "supports_for_update_of", False))


def rows_written(connection: Connection, result: CursorResult[Any]) -> int:
    """The server's affected rows (a row moved forwards counts 2)."""
    return result.rowcount


def write(
    conn: Connection,
    form: Form,
    chunk_params: list[dict[str, Any]],
    options: Mapping[str, Any],
    lock_wait_s: float,
    metrics: Metrics,
) -> tuple[dt.datetime, int]:
    """MySQL 8 (MariaDB's ``SKIP LOCKED`` stands in): share-lock the consumers, stamp, INSERT.

    Sends, per chunk of events: ``SELECT dag_id ...`` (every consumer, paused or not, no locks), then
    ``SELECT dag_id FROM dag WHERE dag_id IN (:dag_ids) ORDER BY dag_id FOR SHARE`` (MariaDB: ``LOCK IN
    SHARE MODE``); then ``SELECT utc_timestamp(6)``, ``UPDATE asset_event SET timestamp = :stamp WHERE id
    IN (:ids)`` and the ordered ``INSERT ... SELECT`` of each chunk. InnoDB locks a locking read's rows
    in access order, not ``ORDER BY`` order: an ``IN`` list on the key is a range scan of the primary
    key in its collation's order (Airflow's utf8mb3_bin compares code points, as Python does), the
    order every one of Airflow's writers of ``dag`` locks an ``IN`` list in. So it waits while it holds
    the rows before, in that order: no cycle with them (``tests/concurrency/test_writer_cycles.py``).
    MySQL 8's scheduler skips share-locked rows (``FOR UPDATE SKIP LOCKED``). ``lock_wait_s`` is not
    used: ``innodb_lock_wait_timeout`` bounds each wait (a lock wait timeout rolls back the statement).
    """
    for params in chunk_params:
        found = conn.execute(statement.referencing_dags(form), params, execution_options=options)
        dag_ids = sorted(set(found.scalars()))
        if dag_ids:
            conn.execute(_SHARE_LOCK, {"dag_ids": dag_ids}, execution_options=options)
    return queue.stamp_then_insert(conn, form, chunk_params, options)


_DAG = tables.dag
_SHARE_LOCK = (
    select(_DAG.c.dag_id)
    .where(_DAG.c.dag_id.in_(bindparam("dag_ids", expanding=True)))
    .order_by(_DAG.c.dag_id)
    .with_for_update(read=True, of=_DAG)
)
