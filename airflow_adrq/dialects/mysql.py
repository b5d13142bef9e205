"""MySQL 8 / MariaDB (InnoDB): ``INSERT ... ON DUPLICATE KEY UPDATE`` no-op.

Never ``INSERT IGNORE``: it takes a *shared* lock on a duplicate row, which
deadlocks against a consumer deleting that row (shared-to-exclusive upgrade),
and it downgrades FK / NOT NULL errors to warnings. The no-op ODKU takes an
exclusive record lock on the duplicate instead, held until commit.

READ COMMITTED (as Airflow configures MySQL) makes the SELECT half a
consistent read: no shared next-key locks on ``dag_schedule_asset_reference``
or ``dag``; only the inserted/duplicate ADRQ rows and the FK parent records
are locked.

SQLAlchemy renders ``VALUES(col)`` (not MySQL 8.0.20's row alias) for
``INSERT ... SELECT``; both MySQL 8 and MariaDB accept it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Select, Table, func
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.dml import Insert

from airflow_adrq.dialects import ConflictMode, DialectSupport, register


def _insert_from_select(
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
    stmt = mysql.insert(table).from_select(list(columns), select)
    if on_conflict == "ignore":
        first = key[0]
        return stmt.on_duplicate_key_update({first: table.c[first]})
    return stmt.on_duplicate_key_update({refresh: func.greatest(table.c[refresh], stmt.inserted[refresh])})


def _insert_ignore(table: Table) -> Insert:
    first = next(iter(table.primary_key.columns))
    return mysql.insert(table).on_duplicate_key_update({first.name: first})


SUPPORT = register("mysql", "mariadb")(
    DialectSupport(
        name="mysql",
        insert_from_select=_insert_from_select,
        insert_ignore=_insert_ignore,
        # Airflow forces READ COMMITTED on MySQL (settings.prepare_engine_args);
        # under REPEATABLE READ the SELECT would take shared next-key locks.
        engine_kwargs={"isolation_level": "READ COMMITTED"},
    )
)
