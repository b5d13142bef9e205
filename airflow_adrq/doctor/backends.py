"""The one read-only transaction doctor reads in, and what it reads differently on each backend.

Each backend is a :class:`Probe`: no other module compares backend names.

* PostgreSQL: every setting transaction-scoped, so nothing stays on a server
  connection PgBouncer hands to someone else (PgBouncer: :func:`_pgbouncer`).
  Its deadlock counter is this database's own: the verdict cites it.
* MySQL/MariaDB: the plug-in refuses to write above READ COMMITTED, which
  Airflow sets only for URLs starting with ``mysql``: the server's default and
  the URL's scheme are both reported. ``Innodb_deadlocks`` is server-wide: not cited.
* SQLite: the file opened ``mode=ro`` (a missing file is an error, never created).
"""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from airflow_adrq.doctor.report import (
    Compatibility,
    DoctorError,
    Exposure,
    PgBouncer,
    QueueInsert,
    first_line,
)
from airflow_adrq.engine import driver_not_installed

#: Seconds doctor waits for a server to accept a connection.
CONNECT_TIMEOUT = 10

#: The DAG id columns whose collation the report shows.
DAG_ID_COLUMNS = (
    ("dag", "dag_id"),
    ("asset_dag_run_queue", "target_dag_id"),
    ("dag_schedule_asset_reference", "dag_id"),
)


@dataclass(frozen=True)
class Probe:
    """How doctor reads one backend; ``name`` is the report's backend (``"mysql"`` for MariaDB too).

    ``begin_read_only`` makes the transaction read-only before its first query;
    ``read_only_url``: the URL to open; ``search_path`` puts schema ``:schema``
    first for this transaction only (``None``: not checked here). ``compatibility``
    and ``stats`` fill the backend's own fields and return warnings.
    ``cannot_deadlock``: why the verdict is "not needed" whatever the exposure;
    ``deadlock_counter``: who counts this database's own deadlocks (``None``: nobody, or server-wide).
    """

    name: str
    begin_read_only: tuple[str, ...]
    server: Callable[[Connection], str]
    collations: Callable[[Connection], dict[str, str]]
    read_only_url: Callable[[URL], URL] = field(default=lambda url: url)
    search_path: str | None = None
    compatibility: Callable[[Connection, Compatibility], list[str]] = field(default=lambda conn, c: [])
    stats: Callable[[Connection, Exposure], list[str]] = field(default=lambda conn, e: [])
    cannot_deadlock: str | None = None
    deadlock_counter: str | None = None


#: Whether a schema exists (the SQL standard's catalog view; only PostgreSQL takes ``--schema``).
_SCHEMA_EXISTS = sa.text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :schema")


@contextlib.contextmanager
def read_only_connection(url: str | URL, schema: str | None = None) -> Iterator[Connection]:
    """A connection to ``url`` in one read-only transaction, rolled back at the end.

    Unqualified names resolve in ``schema`` first (PostgreSQL only; else
    :class:`DoctorError`). The server refuses a write on it (SQLSTATE 25006,
    MySQL 1792, SQLite "attempt to write a readonly database").
    """
    url = sa.make_url(url)
    probe = get(url)
    url = probe.read_only_url(url)
    drivers = ("psycopg2", "psycopg", "mysqldb", "pymysql")  # the DBAPIs that take connect_timeout
    connect_args = {"connect_timeout": CONNECT_TIMEOUT} if url.get_driver_name() in drivers else {}
    try:
        engine = sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except ImportError as exc:
        raise DoctorError(str(driver_not_installed(url, exc))) from exc
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
                    if not conn.scalar(_SCHEMA_EXISTS, {"schema": schema}):
                        raise DoctorError(f"no such schema {schema!r} in this database (--schema)")
                    conn.execute(sa.text(probe.search_path), {"schema": schema})
                yield conn
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def scalar(conn: Connection, sql: str) -> Any:
    """The first column of the first row ``sql`` returns."""
    return conn.execute(sa.text(sql)).scalar()


def _collations_in(conn: Connection, schema: str, default: str | None) -> dict[str, str]:
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


# PostgreSQL

_HIDDEN = "<insufficient privilege>"


def _pg_collations(conn: Connection) -> dict[str, str]:
    default = scalar(conn, "SELECT datcollate FROM pg_database WHERE datname = current_database()")
    return _collations_in(conn, "current_schema()", default)


def _pg_compatibility(conn: Connection, compatibility: Compatibility) -> list[str]:
    compatibility.pgbouncer = _pgbouncer(conn)
    return []


def _pgbouncer(conn: Connection) -> PgBouncer:
    """Whether ``conn`` goes through PgBouncer, and how that was decided.

    The server seeing this connection's own TCP ports rules it out. Otherwise at
    most three more connections: PgBouncer's admin console (``SHOW`` only), then,
    when it does not tell the pool mode, two that run ``SELECT pg_backend_pid()``.
    """
    ours = _socket_ports(conn)
    row = conn.execute(sa.text("SELECT inet_client_port(), inet_server_port()")).one()
    theirs = (row[0], row[1]) if row[0] is not None else None
    if ours is not None and theirs is not None and ours == theirs:
        return PgBouncer(
            False, f"no: the server sees this connection's own TCP ports ({ours[0]} -> {ours[1]})"
        )
    if ours is None and theirs is None:
        between = "both ends are Unix sockets"
    elif ours is None or theirs is None:
        between = "this end is a Unix socket and the server's is TCP, or the reverse"
    else:
        between = f"ports {ours[0]} -> {ours[1]} here, {theirs[0]} -> {theirs[1]} at the server"
    detected, how, mode = _admin_console(conn.engine)
    mode_how = "SHOW DATABASES / SHOW CONFIG" if mode else None
    if detected and mode is None:
        mode, mode_how = _pool_mode_by_behaviour(conn.engine)
    return PgBouncer(detected, f"{between}; {how}", mode, mode_how)


def _socket_ports(conn: Connection) -> tuple[int, int] | None:
    """``(local port, remote port)`` of the connection's socket; ``None`` for a Unix socket or no access."""
    raw: Any = conn.connection.dbapi_connection
    try:
        with socket.socket(fileno=os.dup(int(raw.fileno()))) as sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            return int(sock.getsockname()[1]), int(sock.getpeername()[1])
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def _admin_console(engine: Engine) -> tuple[bool | None, str, str | None]:
    """``(is PgBouncer, what was seen, pool mode)`` from database ``pgbouncer``, same host and user."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url.set(database="pgbouncer"))
    try:
        console: Any = engine.dialect.connect(*cargs, **{**cparams, "connect_timeout": CONNECT_TIMEOUT})
    except Exception as exc:
        message = first_line(exc)
        if "not allowed" in message:
            return True, "its admin console says 'not allowed' to this user", None
        if 'database "pgbouncer" does not exist' in message:
            return False, "a PostgreSQL server answers for database pgbouncer: not PgBouncer", None
        return None, f"its admin console did not answer: {message}", None
    try:
        console.autocommit = True
        cursor = console.cursor()
        cursor.execute("SHOW VERSION")
        version = " ".join(str(v) for v in cursor.fetchone() or ())
        cursor.execute("SHOW DATABASES")
        names = [d[0] for d in cursor.description]
        records = [dict(zip(names, row, strict=False)) for row in cursor.fetchall()]
        ours = [r for r in records if r.get("name") == engine.url.database]
        modes = [r["pool_mode"] for r in ours if r.get("pool_mode")]
        if not modes:
            cursor.execute("SHOW CONFIG")
            modes = [row[1] for row in cursor.fetchall() if row[0] == "pool_mode"]
        mode = str(modes[-1]) if modes else None
        return True, f"its admin console answers SHOW VERSION: {version}", mode
    except Exception as exc:
        return None, f"database pgbouncer answered, but not as PgBouncer's console: {first_line(exc)}", None
    finally:
        with contextlib.suppress(Exception):
            console.close()


def _pool_mode_by_behaviour(engine: Engine) -> tuple[str, str]:
    """Tell transaction from session pooling by which server process two connections in a row get."""
    pid = "SELECT pg_backend_pid()"
    with engine.connect() as first:
        first_pid = first.exec_driver_sql(pid).scalar()
        first.rollback()  # transaction pooling hands its server connection back here
        with engine.connect() as second:
            second_pid = second.exec_driver_sql(pid).scalar()
            second.rollback()
    if first_pid == second_pid:
        return "transaction", "a 2nd connection got the 1st one's server process while it was connected"
    return "session (probably)", "a 2nd connection got another server process while the 1st was connected"


def _pg_stats(conn: Connection, exposure: Exposure) -> list[str]:
    row = conn.execute(
        sa.text("SELECT deadlocks, stats_reset FROM pg_stat_database WHERE datname = current_database()")
    ).first()
    if row is not None:
        exposure.deadlocks = int(row[0] or 0)
        since = f"since {row[1]:%Y-%m-%d %H:%M}" if row[1] is not None else "since the cluster was created"
        exposure.deadlocks_scope = f"this database, any table, {since}"
    schema = scalar(
        conn,
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_stat_statements'",
    )
    if schema is None:
        exposure.queue_inserts_note = "pg_stat_statements is not installed in this database"
        return []
    if scalar(conn, "SELECT current_setting('pg_stat_statements.max', true)") is None:
        exposure.queue_inserts_note = "pg_stat_statements is installed but not in shared_preload_libraries"
        return []
    quoted = conn.dialect.identifier_preparer.quote_identifier(str(schema))
    mean = "mean_exec_time" if int(scalar(conn, "SHOW server_version_num")) >= 130000 else "mean_time"
    try:
        # A view missing or a privilege lacking must not end the transaction.
        with conn.begin_nested():
            found = conn.execute(
                sa.text(
                    f"SELECT CASE WHEN query = '{_HIDDEN}' THEN NULL"
                    "  WHEN query ILIKE '%select%' AND query ILIKE '%asset_event%'"
                    "    THEN 'airflow-adrq''s statement (INSERT ... SELECT)'"
                    "  WHEN query ILIKE '%values%' THEN 'Airflow''s own insert (INSERT ... VALUES)'"
                    "  ELSE 'other insert' END,"
                    f" sum(calls), coalesce(sum(calls * {mean}) / nullif(sum(calls), 0), 0)"
                    f" FROM {quoted}.pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) AND "
                    f"(query ILIKE '%insert into asset_dag_run_queue%' OR query = '{_HIDDEN}') GROUP BY 1"
                )
            ).all()
    except DBAPIError as exc:
        exposure.queue_inserts_note = f"pg_stat_statements unreadable: {first_line(exc)}"
        return []
    exposure.queue_inserts = [QueueInsert(k, int(calls), float(mean_ms)) for k, calls, mean_ms in found if k]
    if not exposure.queue_inserts:
        exposure.queue_inserts_note = "pg_stat_statements has no insert into asset_dag_run_queue yet"
    if any(kind is None for kind, _, _ in found):
        return ["pg_stat_statements hides other users' queries from this user (grant pg_read_all_stats)"]
    return []


POSTGRESQL = Probe(
    name="postgresql",
    # Unlike default_transaction_read_only, nothing stays on the server connection.
    begin_read_only=("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",),
    # The old path stays after it: `airflow db migrate` leaves alembic_version
    # in the connection's default schema.
    search_path="SELECT set_config('search_path', "
    "quote_ident(:schema) || ', ' || current_setting('search_path'), true)",
    server=lambda conn: f"PostgreSQL {scalar(conn, 'SHOW server_version')}",
    collations=_pg_collations,
    compatibility=_pg_compatibility,
    stats=_pg_stats,
    deadlock_counter="PostgreSQL",
)


# MySQL/MariaDB


def _mysql_server(conn: Connection) -> str:
    raw = str(scalar(conn, "SELECT VERSION()"))
    return f"{'MariaDB' if 'mariadb' in raw.lower() else 'MySQL'} {raw}"


def _mysql_compatibility(conn: Connection, compatibility: Compatibility) -> list[str]:
    sql = "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('transaction_isolation', 'tx_isolation')"
    variables: dict[str, str] = dict(conn.execute(sa.text(sql)).all())
    level = str(variables.get("transaction_isolation") or variables.get("tx_isolation") or "unknown")
    warnings = []
    drivername = conn.engine.url.drivername
    compatibility.isolation = f"server default {level}"
    if drivername.startswith("mysql"):
        compatibility.isolation += "; Airflow's mysql connections use READ COMMITTED"
    elif level.replace("-", " ").upper() not in ("READ COMMITTED", "READ UNCOMMITTED"):
        warnings.append(
            "Airflow sets READ COMMITTED only for URLs starting with mysql: with "
            f"{drivername}:// its connections run at the server's {level}, where the plug-in "
            "refuses to write (IsolationLevelError). Use mysql+mysqldb:// or set "
            "transaction_isolation=READ-COMMITTED"
        )
    compatibility.storage_engine = scalar(
        conn,
        "SELECT engine FROM information_schema.tables WHERE table_schema = DATABASE() "
        "AND table_name = 'asset_dag_run_queue'",
    )
    if "mariadb" in compatibility.server.lower():
        warnings.append("Airflow does not support MariaDB (airflow-adrq's tests run on it)")
    return warnings


def _mysql_stats(conn: Connection, exposure: Exposure) -> list[str]:
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).first()
    if row is not None:
        exposure.deadlocks = int(row[1])
        exposure.deadlocks_scope = "Innodb_deadlocks: the whole server, any table, since it started"
    return []


MYSQL = Probe(
    name="mysql",
    # No transaction is open yet: SET TRANSACTION applies to the one START TRANSACTION opens.
    begin_read_only=(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
    ),
    server=_mysql_server,
    collations=lambda conn: _collations_in(conn, "DATABASE()", None),
    compatibility=_mysql_compatibility,
    stats=_mysql_stats,
)


# SQLite


def _sqlite_read_only(url: URL) -> URL:
    database = url.database or ""
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        query = {"uri": "true", **url.query}
        if "mode=" not in database and "mode" not in query:
            query["mode"] = "ro"
        return url.set(query=query)
    if database in ("", ":memory:"):
        raise DoctorError("an in-memory SQLite database holds no Airflow schema: pass the database file")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise DoctorError(f"no SQLite database file at {path}")
    file = f"file:{urllib.parse.quote(str(path))}"
    return url.set(database=file, query={**url.query, "mode": "ro", "uri": "true"})


SQLITE = Probe(
    name="sqlite",
    read_only_url=_sqlite_read_only,
    begin_read_only=("PRAGMA query_only = ON", "BEGIN"),
    server=lambda conn: f"SQLite {scalar(conn, 'SELECT sqlite_version()')}",
    # SQLite's default collation, not read from the schema.
    collations=lambda conn: {f"{t}.{c}": "BINARY" for t, c in DAG_ID_COLUMNS},
    cannot_deadlock="SQLite runs one writer at a time: two transactions never hold queue-row locks "
    "together, so there is no deadlock to remove (and Airflow does not support SQLite in production)",
)

_PROBES = {"postgresql": POSTGRESQL, "mysql": MYSQL, "mariadb": MYSQL, "sqlite": SQLITE}


def get(backend: str | URL) -> Probe:
    """The :class:`Probe` of a backend name or URL (:class:`DoctorError` if Airflow does not run on it)."""
    name = backend if isinstance(backend, str) else backend.get_backend_name()
    if name not in _PROBES:
        raise DoctorError(
            f"{name} is not a database Airflow 3 runs on: doctor reads PostgreSQL, MySQL/MariaDB and SQLite"
        )
    return _PROBES[name]
