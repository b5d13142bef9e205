"""MySQL 8 / MariaDB (InnoDB): ``INSERT ... ON DUPLICATE KEY UPDATE`` no-op.

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

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Select, Table, exists, func
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection
from sqlalchemy.sql.dml import Insert

from airflow_adrq.dialects import ConflictMode, DialectSupport
from airflow_adrq.errors import AdrqError, IsolationLevelError
from airflow_adrq.tables import UtcDateTime

#: Execution option that lets a connection write the queue at any isolation level.
ALLOW_ISOLATION_OPTION = "adrq_allow_isolation"

# Levels under which INSERT ... SELECT reads without next-key locks.
_LOCK_FREE_READS = frozenset({"READ COMMITTED", "READ UNCOMMITTED", "AUTOCOMMIT"})
_LEVEL_KEY = "airflow_adrq.isolation_level"


def _insert_from_select(
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
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


def _check_connection(connection: Connection) -> None:
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


def _insert_ignore(table: Table) -> Insert:
    first = next(iter(table.primary_key.columns))
    return mysql.insert(table).on_duplicate_key_update({first.name: first})


def _require_explicit_timestamp_defaults(connection: Connection) -> None:
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


SUPPORT = DialectSupport(
    name="mysql",
    insert_from_select=_insert_from_select,
    insert_ignore=_insert_ignore,
    # As Airflow forces on MySQL (settings.prepare_engine_args).
    engine_kwargs={"isolation_level": "READ COMMITTED"},
    check_connection=_check_connection,
    # MySQL 8's scheduler locks the rows it consumes: refresh waits for it. MariaDB's does not, and
    # deletes DAG by DAG: refresh would deadlock. (Airflow's with_row_locks adds FOR UPDATE ... SKIP
    # LOCKED only where the dialect supports FOR UPDATE OF: MySQL 8; not MariaDB, MDEV-13115.)
    refresh_by_default=lambda connection: bool(getattr(connection.dialect, "supports_for_update_of", False)),
    # UTC wall time, as the naive UTC values sent for TIMESTAMP columns (tables.UtcDateTime); per statement.
    clock=lambda: func.utc_timestamp(6, type_=UtcDateTime()),
    # MySQL 8's scheduler skips share-locked dag rows (FOR UPDATE SKIP LOCKED). InnoDB locks in
    # access order: the consumers are locked by their id list, a range scan of the primary key in its
    # collation's order; Airflow's utf8mb3_bin compares code points, as Python does. SQLAlchemy
    # renders FOR SHARE (MySQL 8) or LOCK IN SHARE MODE (MariaDB).
    lock_order=lambda dag_id: dag_id,
    lock_by_id_list=True,
    transactional_ddl=False,
    check_before_ddl=_require_explicit_timestamp_defaults,
)
