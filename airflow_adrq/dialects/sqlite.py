"""SQLite: the queue write (:func:`write`), ``INSERT ... ON CONFLICT`` (SQLite >= 3.24).

SQLite has one writer at a time, so row order cannot deadlock; the risk is a DEFERRED
transaction that reads first and then cannot upgrade to a write lock (``SQLITE_BUSY`` without the
busy handler being called). Engines made by :func:`airflow_adrq.engine.create_engine` therefore
start every transaction with ``BEGIN IMMEDIATE`` and wait on a busy timeout. The SELECT always has
a WHERE clause, which SQLite's upsert parser needs after ``INSERT ... SELECT``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Select, event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, CursorResult, Engine

from airflow_adrq import queue
from airflow_adrq.dialects import ConflictMode, on_conflict_insert_from_select
from airflow_adrq.metrics import Metrics
from airflow_adrq.statement import Form

#: Seconds a writer waits for the database lock before SQLITE_BUSY.
BUSY_TIMEOUT_SECONDS = 30


def configure_engine(engine: Engine) -> None:
    """``BEGIN IMMEDIATE``, ``PRAGMA foreign_keys=ON`` and the busy timeout on every connection."""

    # SQLAlchemy's documented recipe: take pysqlite's own transaction handling away and emit BEGIN
    # ourselves, so it can be BEGIN IMMEDIATE.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # Airflow enables FK enforcement on SQLite too (ON DELETE CASCADE).
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_SECONDS * 1000:d}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def rows_written(connection: Connection, result: CursorResult[Any]) -> int:
    """``changes()``: the rows the last statement inserted or updated."""
    # pysqlite counts rows only for a statement it sees begin with INSERT, UPDATE, DELETE
    # or REPLACE; the queue statement begins with its WITH: ask SQLite.
    return cast(int, connection.exec_driver_sql("SELECT changes()").scalar_one())


name = "sqlite"
#: The engine's settings are listeners (:func:`configure_engine`).
engine_kwargs: Mapping[str, Any] = {}
driver_extra: str | None = None
#: Python's clock: SQLite runs on this host.
clock = None
stamp_in_one_statement = False
transactional_ddl = True


def check_connection(connection: Connection) -> None:
    """Nothing to check."""


def check_before_ddl(connection: Connection) -> None:
    """Nothing to check."""


def refresh_by_default(connection: Connection) -> bool:
    """One writer at a time: a refresh in the statement waits for no one."""
    return True


def insert_from_select(
    table: Any,
    columns: Sequence[Any],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Any:
    """``INSERT ... SELECT ... ON CONFLICT DO NOTHING`` or ``DO UPDATE SET refresh = max(...)`` (SQLite's
    two-argument ``max()`` is a scalar function, like GREATEST)."""
    return on_conflict_insert_from_select(
        sqlite.insert, "max", table, columns, select, key, on_conflict, refresh
    )


def insert_ignore(table: Any) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING``."""
    return sqlite.insert(table).on_conflict_do_nothing()


def write(
    conn: Connection,
    form: Form,
    chunk_params: list[dict[str, Any]],
    options: Mapping[str, Any],
    lock_wait_s: float,
    metrics: Metrics,
) -> tuple[dt.datetime, int]:
    """Python's clock, ``UPDATE asset_event SET timestamp``, then the ordered ``INSERT ... SELECT``.

    No row locks: the transaction holds the database's write lock from its ``BEGIN IMMEDIATE``.
    """
    return queue.stamp_then_insert(conn, form, chunk_params, options)
