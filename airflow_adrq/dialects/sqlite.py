"""SQLite: ``INSERT ... ON CONFLICT DO NOTHING`` (SQLite >= 3.24).

SQLite has one writer at a time, so row order cannot deadlock; the risk is a DEFERRED
transaction that reads first and then cannot upgrade to a write lock (``SQLITE_BUSY`` without the
busy handler being called). Engines made by :func:`airflow_adrq.engine.create_engine` therefore
start every transaction with ``BEGIN IMMEDIATE`` and wait on a busy timeout. The SELECT always has
a WHERE clause, which SQLite's upsert parser needs after ``INSERT ... SELECT``.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Engine

from airflow_adrq.dialects import DialectSupport, on_conflict_insert_from_select

#: Seconds a writer waits for the database lock before SQLITE_BUSY.
BUSY_TIMEOUT_SECONDS = 30


def _configure_engine(engine: Engine) -> None:
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


def _rows_written(connection: Connection, _result: Any) -> int:
    # pysqlite counts rows only for a statement it sees begin with INSERT, UPDATE, DELETE
    # or REPLACE; the queue statement begins with its WITH: ask SQLite.
    return cast(int, connection.exec_driver_sql("SELECT changes()").scalar_one())


SUPPORT = DialectSupport(
    name="sqlite",
    # SQLite's two-argument max() is a scalar function, like GREATEST.
    insert_from_select=functools.partial(on_conflict_insert_from_select, sqlite.insert, "max"),
    insert_ignore=lambda table: sqlite.insert(table).on_conflict_do_nothing(),
    configure_engine=_configure_engine,
    rows_written=_rows_written,
)
