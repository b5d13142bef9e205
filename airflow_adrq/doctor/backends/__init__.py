"""The one read-only transaction doctor reads in, and what it reads differently on each backend.

Generic modules ask :func:`get` for a backend's :class:`Probe` and never
compare backend names; adding a backend means adding a module here that
defines ``PROBE``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection
from sqlalchemy.pool import NullPool

from airflow_adrq.doctor.report import Compatibility, DoctorError, Exposure

#: Seconds doctor waits for a server to accept a connection.
CONNECT_TIMEOUT = 10
#: The DAG id columns whose collation the report shows.
DAG_ID_COLUMNS = (
    ("dag", "dag_id"),
    ("asset_dag_run_queue", "target_dag_id"),
    ("dag_schedule_asset_reference", "dag_id"),
)
# SQLAlchemy backend name -> the module of this package that reads it.
_MODULES = {"mysql": "mysql", "mariadb": "mysql", "postgresql": "postgresql", "sqlite": "sqlite"}


def _connect_timeout(url: URL) -> tuple[URL, dict[str, Any]]:
    drivers = ("psycopg2", "psycopg", "mysqldb", "pymysql")  # the DBAPIs that take connect_timeout
    return url, ({"connect_timeout": CONNECT_TIMEOUT} if url.get_driver_name() in drivers else {})


@dataclass(frozen=True)
class Probe:
    """How doctor reads one backend; ``name`` is the report's backend (``"mysql"`` for MariaDB too).

    ``begin_read_only``: the statements that make the transaction read-only
    before its first query. ``engine_args(url)``: the URL and ``connect_args``
    to open (by default, a connect timeout). ``search_path`` resolves
    unqualified names in a schema first, for that transaction only (``None``:
    not checked here). ``compatibility`` and ``stats`` fill the backend's own
    fields and return warnings. ``cannot_deadlock``: why the verdict is "not
    needed" whatever the exposure; ``deadlock_counter``: who counts this
    database's own deadlocks, cited in the verdict (``None``: no counter, or a
    server-wide one).
    """

    name: str
    begin_read_only: tuple[str, ...]
    server: Callable[[Connection], str]
    collations: Callable[[Connection], dict[str, str]]
    engine_args: Callable[[URL], tuple[URL, dict[str, Any]]] = field(default=_connect_timeout)
    search_path: Callable[[Connection, str], None] | None = None
    compatibility: Callable[[Connection, Compatibility], list[str]] = field(default=lambda conn, c: [])
    stats: Callable[[Connection, Exposure], list[str]] = field(default=lambda conn, e: [])
    cannot_deadlock: str | None = None
    deadlock_counter: str | None = None


def get(backend: str | URL) -> Probe:
    """The :class:`Probe` of a backend name or URL (:class:`DoctorError` if Airflow does not run on it)."""
    name = backend if isinstance(backend, str) else backend.get_backend_name()
    if name not in _MODULES:
        raise DoctorError(
            f"{name} is not a database Airflow 3 runs on: doctor reads PostgreSQL, MySQL/MariaDB and SQLite"
        )
    probe: Probe = importlib.import_module(f"{__name__}.{_MODULES[name]}").PROBE
    return probe


@contextlib.contextmanager
def read_only_connection(url: str | URL, schema: str | None = None) -> Iterator[Connection]:
    """A connection to ``url`` in one read-only transaction, rolled back at the end.

    Unqualified names resolve in ``schema`` first (PostgreSQL only; else
    :class:`DoctorError`). The server refuses a write on it (SQLSTATE 25006,
    MySQL 1792, SQLite "attempt to write a readonly database").
    """
    url = sa.make_url(url)
    probe = get(url)
    url, connect_args = probe.engine_args(url)
    engine = sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            # SQLAlchemy's first-connect checks ran in a transaction of their
            # own; start from none, so the read-only one is the first.
            conn.rollback()
            for statement in probe.begin_read_only:
                conn.exec_driver_sql(statement)
            try:
                if schema:
                    if probe.search_path is None:
                        raise DoctorError(
                            f"[database] sql_alchemy_schema ({schema!r}) is only checked on PostgreSQL; on "
                            "MySQL/MariaDB name Airflow's database in the URL instead"
                        )
                    probe.search_path(conn, schema)
                yield conn
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def scalar(conn: Connection, sql: str) -> Any:
    return conn.execute(sa.text(sql)).scalar()


def information_schema_collations(conn: Connection, schema: str, default: str | None) -> dict[str, str]:
    """The collation of each of :data:`DAG_ID_COLUMNS` in ``schema`` (SQL), else the ``default``."""
    out: dict[str, str] = {}
    for table, column in DAG_ID_COLUMNS:
        row = conn.execute(
            sa.text(
                "SELECT collation_name FROM information_schema.columns WHERE table_schema = "
                f"{schema} AND table_name = :t AND column_name = :c"
            ),
            {"t": table, "c": column},
        ).first()
        if row is not None:
            out[f"{table}.{column}"] = row[0] or f"database default ({default})"
    return out
