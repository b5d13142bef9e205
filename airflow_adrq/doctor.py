"""``airflow-adrq doctor``: should this Airflow deployment enable the plug-in? A read-only check.

::

    airflow-adrq doctor [--url URL] [--json]

Reads an Airflow metadata database and reports, on one screen:

* **Compatibility** -- the Airflow schema version (``alembic_version``), the
  queue's primary key (:func:`airflow_adrq.shapes.detect`), whether the
  plug-in supports that release line (:mod:`airflow_adrq.airflow.compat`),
  the server, MySQL/MariaDB's isolation level, the collation of the DAG id
  columns, and whether the connection goes through PgBouncer.
* **Exposure** -- how many consumer DAGs each asset has (direct, name and URI
  references of unpaused DAGs), assets produced by several tasks, tasks with
  several outlets, alias use, and on PostgreSQL the database's deadlock
  counter and (with ``pg_stat_statements``) the queue inserts' calls and
  mean time.
* **Verdict** -- enable, not needed, or not supported, with the reason.

Exit status: **0** enable, **1** not needed, **2** not supported, **3** no
report (not an Airflow metadata database, or it could not be read). Usage
errors are argparse's 2.

Read-only by construction, and tested so (``tests/integration/test_doctor.py``):
one transaction, made read-only before the first query and rolled back at the
end -- PostgreSQL ``SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ
ONLY`` (transaction-scoped, so nothing leaks into a pooled server connection
behind PgBouncer), MySQL/MariaDB ``START TRANSACTION WITH CONSISTENT SNAPSHOT,
READ ONLY``, SQLite a file opened with ``mode=ro`` (a missing file is not
created) and ``PRAGMA query_only``. Every statement is a ``SELECT``, ``SHOW``
or a catalog read, all from one snapshot. PgBouncer detection opens at most
three more connections: to PgBouncer's admin console (``SHOW`` commands only)
and two that each run ``SELECT pg_backend_pid()``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import socket
import sys
import textwrap
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from airflow_adrq import queue, shapes
from airflow_adrq._airflow_revisions import KNOWN_UP_TO, REVISIONS
from airflow_adrq.airflow import compat
from airflow_adrq.errors import AdrqError, UnsupportedSchemaError

__all__ = [
    "CONFIG_LINE",
    "ENABLE",
    "EXIT_CODES",
    "EXIT_NO_REPORT",
    "NOT_NEEDED",
    "NOT_SUPPORTED",
    "Compatibility",
    "DoctorError",
    "Exposure",
    "PgBouncer",
    "Report",
    "SchemaVersion",
    "add_doctor_parser",
    "airflow_url",
    "check",
    "read_only_connection",
    "render_json",
    "render_text",
]

ENABLE = "enable"
NOT_NEEDED = "not needed"
NOT_SUPPORTED = "not supported"
#: Exit status of each verdict.
EXIT_CODES = {ENABLE: 0, NOT_NEEDED: 1, NOT_SUPPORTED: 2}
#: Exit status when there is no report: not an Airflow database, or unreadable.
EXIT_NO_REPORT = 3

CONFIG_SECTION = "[core]"
CONFIG_LINE = "asset_manager_class = airflow_adrq.airflow.AdrqAssetManager"

#: Fan-out thresholds the report counts assets above.
FANOUT_THRESHOLDS = (64, 1024)

_BACKENDS = ("postgresql", "mysql", "sqlite")
_CONNECT_TIMEOUT = 10


class DoctorError(AdrqError):
    """This database cannot be checked."""


# --- the report ----------------------------------------------------------------


@dataclass(frozen=True)
class SchemaVersion:
    """Where ``alembic_version`` puts the database in Airflow's migration history."""

    revision: str
    #: The Airflow release whose migration this revision is (``None``: unknown revision).
    airflow_version: str | None
    #: ``(major, minor)`` of :attr:`airflow_version`.
    line: tuple[int, int] | None
    #: The revision is the last migration of :attr:`airflow_version` (else: a migration stopped half-way).
    complete: bool


@dataclass(frozen=True)
class PgBouncer:
    """Whether the connection goes through PgBouncer, and how that was decided."""

    #: ``True``/``False``; ``None`` when it cannot be told.
    detected: bool | None
    how: str
    pool_mode: str | None = None
    pool_mode_how: str | None = None


@dataclass
class Compatibility:
    backend: str
    server: str
    schema: SchemaVersion
    #: The primary key of ``asset_dag_run_queue`` as found (``None``: no such table).
    queue_key: tuple[str, ...] | None
    #: :class:`airflow_adrq.shapes.QueueShape` name, or ``None`` when :func:`shapes.detect` refused it.
    shape: str | None
    supported: bool
    #: Why (not) supported, one sentence.
    support: str
    #: The supported release lines whose migrations make this shape, e.g. ``["3.2", "3.3"]``.
    shape_lines: list[str] = field(default_factory=list)
    #: The release of the line the plug-in is tested with.
    tested: str | None = None
    #: MySQL/MariaDB: the server's default isolation level, and what Airflow's connections use.
    isolation: str | None = None
    #: Collation of each DAG id column, ``"table.column": collation``.
    dag_id_collations: dict[str, str] = field(default_factory=dict)
    #: MySQL/MariaDB: the queue table's storage engine.
    storage_engine: str | None = None
    pgbouncer: PgBouncer | None = None


@dataclass
class QueueInsert:
    """One ``pg_stat_statements`` entry that inserts into ``asset_dag_run_queue``."""

    kind: str
    calls: int
    mean_ms: float


@dataclass
class Exposure:
    #: Active assets, and those with at least one consumer DAG.
    assets: int
    assets_with_consumers: int
    #: Consumer DAGs per asset with consumers: max, p50, p99 (nearest rank).
    fanout_max: int
    fanout_p50: int
    fanout_p99: int
    #: Assets with more than N consumer DAGs, for N in :data:`FANOUT_THRESHOLDS`.
    fanout_over: dict[int, int]
    #: Assets with two or more consumer DAGs.
    multi_consumer_assets: int
    #: Assets produced by several tasks / by tasks of several DAGs / of those, with 2+ consumers.
    several_producers: int
    several_producer_dags: int
    racing: int
    #: Tasks with several outlets / of those, queueing 2+ rows per success / sharing a consumer DAG.
    multi_outlet_tasks: int
    multi_outlet_multirow: int
    multi_outlet_shared: int
    #: Aliases / DAG schedule references on aliases / asset links / aliases whose events queue 2+ rows.
    aliases: int
    alias_references: int
    alias_links: int
    alias_multirow: int
    #: PostgreSQL: ``pg_stat_database.deadlocks`` of this database, and since when.
    #: MariaDB: ``Innodb_deadlocks`` (server-wide, since start).
    deadlocks: int | None = None
    deadlocks_scope: str | None = None
    #: PostgreSQL: ``pg_stat_statements`` entries inserting into the queue; ``None`` when unavailable.
    queue_inserts: list[QueueInsert] | None = None
    queue_inserts_note: str | None = None


@dataclass
class Report:
    url: str
    compatibility: Compatibility
    exposure: Exposure | None
    verdict: str
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


# --- the read-only connection -------------------------------------------------


def _backend(url: URL) -> str:
    name = url.get_backend_name()
    return "mysql" if name == "mariadb" else name


def _sqlite_read_only(url: URL) -> URL:
    """``url`` opened read-only (``mode=ro``): a missing file is an error, never created."""
    database = url.database or ""
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        query = dict(url.query)
        query.setdefault("uri", "true")
        if "mode=" not in database and "mode" not in query:
            query["mode"] = "ro"
        return url.set(query=query)
    if database in ("", ":memory:"):
        raise DoctorError("an in-memory SQLite database holds no Airflow schema: pass the database file")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise DoctorError(f"no SQLite database file at {path}")
    return url.set(
        database=f"file:{urllib.parse.quote(str(path))}", query={**url.query, "mode": "ro", "uri": "true"}
    )


def _engine(url: URL) -> Engine:
    backend = _backend(url)
    if backend not in _BACKENDS:
        raise DoctorError(
            f"{url.get_backend_name()} is not a database Airflow 3 runs on: doctor reads PostgreSQL, "
            "MySQL/MariaDB and SQLite"
        )
    connect_args: dict[str, Any] = {}
    if backend == "sqlite":
        url = _sqlite_read_only(url)
    elif url.get_driver_name() in ("psycopg2", "psycopg", "mysqldb", "pymysql"):
        connect_args["connect_timeout"] = _CONNECT_TIMEOUT
    return sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)


def _begin_read_only(conn: Connection) -> None:
    """Make the connection's transaction read-only, before its first query."""
    backend = _backend(conn.engine.url)
    if backend == "postgresql":
        # Transaction-scoped: unlike default_transaction_read_only, nothing
        # stays on a server connection PgBouncer hands to someone else.
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    elif backend == "mysql":
        # The DBAPI is not in autocommit mode and has not started a transaction
        # yet: SET TRANSACTION applies to the next one, which START TRANSACTION opens.
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
    else:
        conn.exec_driver_sql("PRAGMA query_only = ON")
        conn.exec_driver_sql("BEGIN")


def _use_schema(conn: Connection, schema: str | None) -> None:
    """Resolve unqualified names in ``schema`` first, for this transaction only (PostgreSQL)."""
    if not schema:
        return
    if _backend(conn.engine.url) != "postgresql":
        raise DoctorError(
            f"[database] sql_alchemy_schema ({schema!r}) is only checked on PostgreSQL; on "
            "MySQL/MariaDB name Airflow's database in the URL instead"
        )
    # set_config(..., true) is SET LOCAL: nothing stays on a pooled connection.
    # The old path stays after it: `airflow db migrate` leaves alembic_version
    # in the connection's default schema.
    conn.execute(
        sa.text(
            "SELECT set_config('search_path', "
            "quote_ident(:schema) || ', ' || current_setting('search_path'), true)"
        ),
        {"schema": schema},
    )


@contextlib.contextmanager
def read_only_connection(url: str | URL, schema: str | None = None) -> Iterator[Connection]:
    """A connection to ``url`` inside one read-only transaction, rolled back at the end.

    ``schema``: the PostgreSQL schema Airflow's tables are in (``[database]
    sql_alchemy_schema``); unqualified names resolve there first.

    A write attempted on it is refused by the server (PostgreSQL SQLSTATE
    25006, MySQL/MariaDB 1792, SQLite "attempt to write a readonly
    database"). Raises :class:`DoctorError` for a backend Airflow does not run
    on, or a SQLite file that does not exist.
    """
    engine = _engine(sa.make_url(url))
    try:
        with engine.connect() as conn:
            # SQLAlchemy's first-connect checks ran in a transaction of their
            # own; start from none, so the read-only one is the first.
            conn.rollback()
            _begin_read_only(conn)
            try:
                _use_schema(conn, schema)
                yield conn
            finally:
                conn.rollback()
    finally:
        engine.dispose()


# --- schema version -----------------------------------------------------------


def _line(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def _installed_airflow_revisions() -> list[tuple[str, str]]:
    """``(revision, airflow_version)`` from the migration files of an installed Airflow, read as text.

    Finds the package without importing it (importing Airflow loads its configuration).
    """
    try:
        spec = importlib.util.find_spec("airflow")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    versions = Path(next(iter(spec.submodule_search_locations))) / "migrations" / "versions"
    found = []
    for path in sorted(versions.glob("[0-9][0-9][0-9][0-9]_*.py")):
        text = path.read_text(errors="replace")
        revision = re.search(r'^revision\s*=\s*["\'](\w+)["\']', text, re.M)
        version = re.search(r'^airflow_version\s*=\s*["\']([^"\']+)["\']', text, re.M)
        if revision and version:
            found.append((revision[1], version[1]))
    return found


def schema_version(revision: str) -> SchemaVersion:
    """Place an ``alembic_version`` revision in Airflow's history (known releases, then an installed one)."""
    for chain in (REVISIONS, None):
        revisions = list(chain) if chain is not None else _installed_airflow_revisions()
        versions = dict(revisions)
        if revision not in versions:
            continue
        version = versions[revision]
        last_of_version = [r for r, v in revisions if v == version][-1]
        return SchemaVersion(revision, version, _line(version), revision == last_of_version)
    return SchemaVersion(revision, None, None, False)


# --- compatibility ------------------------------------------------------------


def _scalar(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(sa.text(sql), params).scalar()


def _server(conn: Connection, backend: str) -> str:
    if backend == "postgresql":
        return f"PostgreSQL {_scalar(conn, 'SHOW server_version')}"
    if backend == "mysql":
        raw = str(_scalar(conn, "SELECT VERSION()"))
        return f"{'MariaDB' if 'mariadb' in raw.lower() else 'MySQL'} {raw}"
    return f"SQLite {_scalar(conn, 'SELECT sqlite_version()')}"


def _alembic_revision(conn: Connection, tables: set[str]) -> str:
    if "alembic_version" not in tables:
        if "airflow_adrq_version" in tables:
            own = _scalar(conn, "SELECT version_num FROM airflow_adrq_version")
            raise DoctorError(
                f"this is airflow-adrq's own database (airflow_adrq_version {own}), not an Airflow "
                "metadata database: pass Airflow's [database] sql_alchemy_conn as --url"
            )
        if {"dag", "asset_dag_run_queue"} <= tables:
            raise DoctorError(
                "no alembic_version table: these are airflow-adrq's own tables (or a copy), not a database "
                "Airflow migrated; pass Airflow's [database] sql_alchemy_conn as --url"
            )
        raise DoctorError(
            "no alembic_version table: not an Airflow metadata database; pass Airflow's "
            "[database] sql_alchemy_conn as --url"
        )
    revisions = [str(r) for r in conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()]
    if len(revisions) != 1:
        raise DoctorError(
            f"alembic_version holds {len(revisions)} revisions ({', '.join(revisions) or 'none'}): "
            "not an Airflow metadata database (Airflow's history has one head)"
        )
    revision = revisions[0]
    if "dag" not in tables and schema_version(revision).airflow_version is None:
        raise DoctorError(
            f"alembic_version {revision} is no Airflow migration and there is no dag table: "
            "not an Airflow metadata database"
        )
    return revision


def _support(
    schema: SchemaVersion, found: shapes.QueueShape | None, shape_error: str | None
) -> tuple[bool, str, str | None]:
    """``(supported, why, tested release)`` for this schema."""
    if schema.airflow_version is None:
        return (
            False,
            f"alembic revision {schema.revision} is unknown to this airflow-adrq (it knows Airflow up to "
            f"{KNOWN_UP_TO}): a newer Airflow? Upgrade airflow-adrq",
            None,
        )
    line = schema.line
    name = f"{line[0]}.{line[1]}" if line else schema.airflow_version
    refused: dict[tuple[int, int], str] = getattr(compat, "REFUSED", {})
    if line in refused:
        return False, f"Airflow {name} is refused: {refused[line]}", None
    supported_lines = ", ".join(f"{a}.{b}" for a, b in compat.SUPPORTED)
    if line not in compat.SUPPORTED:
        return False, f"Airflow {name} is not supported (supported: {supported_lines})", None
    adapters: dict[tuple[int, int], Any] = getattr(compat, "ADAPTERS", {})
    tested = getattr(adapters.get(line), "tested", None)
    if found is None:
        return False, f"the queue table is not a shape airflow-adrq writes: {shape_error}", tested
    expected = compat.SHAPES[line]
    if found != expected:
        return (
            False,
            f"Airflow {name} makes the {expected.name} queue, this database has the {found.name} one "
            "(migrated by another Airflow?)",
            tested,
        )
    return True, f"Airflow {name}" + (f", tested with {tested}" if tested else ""), tested


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _below_minimum(schema: SchemaVersion) -> list[str]:
    """A warning when releases of this schema predate the first one of its line the plug-in supports.

    The schema is the same from its release up to the next release that adds a
    migration, so it cannot tell which of those runs.
    """
    adapter = getattr(compat, "ADAPTERS", {}).get(schema.line)
    minimum: tuple[int, ...] | None = getattr(adapter, "minimum", None)
    if schema.airflow_version is None or schema.line is None or minimum is None:
        return []
    if _version_tuple(schema.airflow_version) >= minimum:
        return []
    later = [v for _, v in REVISIONS if _version_tuple(v) > _version_tuple(schema.airflow_version)]
    until = f" up to (not including) {later[0]}" if later else " and later"
    first = ".".join(map(str, minimum))
    return [
        f"this is the schema of Airflow {schema.airflow_version}{until}; the plug-in supports "
        f"{schema.line[0]}.{schema.line[1]} from {first} on (see compat.py): check `airflow version`, "
        "older releases refuse to start with the option set"
    ]


_DAG_ID_COLUMNS = (
    ("dag", "dag_id"),
    ("asset_dag_run_queue", "target_dag_id"),
    ("dag_schedule_asset_reference", "dag_id"),
)


def _collations(conn: Connection, backend: str) -> dict[str, str]:
    if backend == "sqlite":
        return {f"{t}.{c}": "BINARY" for t, c in _DAG_ID_COLUMNS}
    out: dict[str, str] = {}
    schema_filter = "current_schema()" if backend == "postgresql" else "DATABASE()"
    default = (
        _scalar(conn, "SELECT datcollate FROM pg_database WHERE datname = current_database()")
        if backend == "postgresql"
        else None
    )
    for table, column in _DAG_ID_COLUMNS:
        row = conn.execute(
            sa.text(
                "SELECT collation_name FROM information_schema.columns WHERE table_schema = "
                f"{schema_filter} AND table_name = :t AND column_name = :c"
            ),
            {"t": table, "c": column},
        ).first()
        if row is not None:
            out[f"{table}.{column}"] = row[0] or f"database default ({default})"
    return out


def _mysql_isolation(conn: Connection, url: URL) -> tuple[str, list[str]]:
    rows: dict[str, str] = dict(
        conn.execute(
            sa.text("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('transaction_isolation', 'tx_isolation')")
        ).all()
    )
    level = str(rows.get("transaction_isolation") or rows.get("tx_isolation") or "unknown")
    warnings = []
    if url.drivername.startswith("mysql"):
        text = f"server default {level}; Airflow's mysql connections use READ COMMITTED"
    else:
        text = f"server default {level}"
        if level.replace("-", " ").upper() not in ("READ COMMITTED", "READ UNCOMMITTED"):
            warnings.append(
                "Airflow sets READ COMMITTED only for URLs starting with mysql: with "
                f"{url.drivername}:// its connections run at the server's {level}, where the plug-in "
                "refuses to write (IsolationLevelError). Use mysql+mysqldb:// or set "
                "transaction_isolation=READ-COMMITTED"
            )
    return text, warnings


# --- PgBouncer ----------------------------------------------------------------


def _socket_ports(conn: Connection) -> tuple[int, int] | None:
    """``(local port, remote port)`` of the connection's socket; ``None`` for a Unix socket or no access."""
    raw: Any = conn.connection.dbapi_connection
    try:
        fd = int(raw.fileno())
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            return int(sock.getsockname()[1]), int(sock.getpeername()[1])
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def _admin_console(engine: Engine) -> tuple[bool | None, str, str | None]:
    """Ask PgBouncer's admin console (database ``pgbouncer``, same host and user): ``SHOW`` only.

    Returns ``(is PgBouncer, what was seen, pool mode)``.
    """
    url = engine.url.set(database="pgbouncer")
    dialect = engine.dialect
    cargs, cparams = dialect.create_connect_args(url)
    cparams = {**cparams, "connect_timeout": _CONNECT_TIMEOUT}
    try:
        console: Any = dialect.connect(*cargs, **cparams)
    except Exception as exc:
        message = _first_line(exc)
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
        mode = None
        cursor.execute("SHOW DATABASES")
        names = [d[0] for d in cursor.description]
        for row in cursor.fetchall():
            record = dict(zip(names, row, strict=False))
            if record.get("name") == engine.url.database and record.get("pool_mode"):
                mode = str(record["pool_mode"])
        if mode is None:
            cursor.execute("SHOW CONFIG")
            for row in cursor.fetchall():
                if row[0] == "pool_mode":
                    mode = str(row[1])
        return True, f"its admin console answers SHOW VERSION: {version}", mode
    except Exception as exc:
        return None, f"database pgbouncer answered, but not as PgBouncer's console: {_first_line(exc)}", None
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


def _pgbouncer(conn: Connection) -> PgBouncer:
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
    how = f"{between}; {how}"
    if detected is False:
        return PgBouncer(False, how)
    mode_how = "SHOW DATABASES / SHOW CONFIG" if mode else None
    if detected and mode is None:
        mode, mode_how = _pool_mode_by_behaviour(conn.engine)
    return PgBouncer(detected, how, mode, mode_how)


# --- exposure -------------------------------------------------------------------


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _rows(conn: Connection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sa.text(sql))]


def _exposure(conn: Connection, tables: set[str], shape: shapes.QueueShape) -> Exposure:
    active = "asset a JOIN asset_active aa ON aa.name = a.name AND aa.uri = a.uri"
    assets = [r[0] for r in conn.execute(sa.text(f"SELECT a.id FROM {active}"))]
    pairs = {(int(a), str(d)) for a, d in conn.execute(queue.queued_pairs(shape))}
    active_ids = set(assets)
    consumers: dict[int, set[str]] = defaultdict(set)
    for asset_id, dag_id in pairs:
        if asset_id in active_ids:
            consumers[asset_id].add(dag_id)
    counts = sorted(len(d) for d in consumers.values())

    producers: dict[int, set[tuple[str, str]]] = defaultdict(set)
    outlets: dict[tuple[str, str], set[int]] = defaultdict(set)
    if "task_outlet_asset_reference" in tables:
        for asset_id, dag_id, task_id in _rows(
            conn, "SELECT asset_id, dag_id, task_id FROM task_outlet_asset_reference"
        ):
            producers[int(asset_id)].add((str(dag_id), str(task_id)))
            outlets[(str(dag_id), str(task_id))].add(int(asset_id))
    several = {a for a, p in producers.items() if len(p) > 1}
    several_dags = {a for a in several if len({d for d, _ in producers[a]}) > 1}
    racing = {a for a in several if len(consumers.get(a, ())) > 1}

    multi_outlet = [assets_of for assets_of in outlets.values() if len(assets_of) > 1]
    multirow = shared = 0
    for assets_of in multi_outlet:
        rows_per_success = [d for a in assets_of for d in consumers.get(a, ())]
        multirow += len(rows_per_success) > 1
        shared += len(set(rows_per_success)) < len(rows_per_success)

    alias_count = int(_scalar(conn, "SELECT COUNT(*) FROM asset_alias") or 0)
    alias_consumers: dict[int, set[str]] = defaultdict(set)
    for alias_id, dag_id in conn.execute(queue.alias_consumers(shape)):
        alias_consumers[int(alias_id)].add(str(dag_id))
    links = _rows(conn, "SELECT alias_id, asset_id FROM asset_alias_asset")
    alias_assets: dict[int, set[int]] = defaultdict(set)
    for alias_id, asset_id in links:
        alias_assets[int(alias_id)].add(int(asset_id))
    # An event emitted through an alias queues the alias's consumers and its asset's.
    alias_multirow = sum(
        1
        for alias_id, dags in alias_consumers.items()
        if len(dags) > 1
        or any(len(dags | consumers.get(a, set())) > 1 for a in alias_assets.get(alias_id, ()))
    )
    return Exposure(
        assets=len(assets),
        assets_with_consumers=len(counts),
        fanout_max=counts[-1] if counts else 0,
        fanout_p50=_percentile(counts, 0.50),
        fanout_p99=_percentile(counts, 0.99),
        fanout_over={n: sum(1 for c in counts if c > n) for n in FANOUT_THRESHOLDS},
        multi_consumer_assets=sum(1 for c in counts if c > 1),
        several_producers=len(several),
        several_producer_dags=len(several_dags),
        racing=len(racing),
        multi_outlet_tasks=len(multi_outlet),
        multi_outlet_multirow=multirow,
        multi_outlet_shared=shared,
        aliases=alias_count,
        alias_references=sum(len(d) for d in alias_consumers.values()),
        alias_links=len(links),
        alias_multirow=alias_multirow,
    )


@contextlib.contextmanager
def _optional(conn: Connection) -> Iterator[None]:
    """A probe that may fail (a view missing, a privilege lacking) without ending the transaction."""
    with conn.begin_nested():
        yield


def _classify_insert(query: str) -> str:
    q = " ".join(query.split()).lower()
    if "select" in q and "asset_event" in q:
        return "airflow-adrq's statement (INSERT ... SELECT)"
    if "values" in q:
        return "Airflow's own insert (INSERT ... VALUES)"
    return "other insert"


def _postgresql_stats(conn: Connection, exposure: Exposure, warnings: list[str]) -> None:
    row = conn.execute(
        sa.text("SELECT deadlocks, stats_reset FROM pg_stat_database WHERE datname = current_database()")
    ).first()
    if row is not None:
        exposure.deadlocks = int(row[0] or 0)
        since = f"since {row[1]:%Y-%m-%d %H:%M}" if row[1] is not None else "since the cluster was created"
        exposure.deadlocks_scope = f"this database, any table, {since}"
    schema = _scalar(
        conn,
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_stat_statements'",
    )
    if schema is None:
        exposure.queue_inserts_note = "pg_stat_statements is not installed in this database"
        return
    if _scalar(conn, "SELECT current_setting('pg_stat_statements.max', true)") is None:
        exposure.queue_inserts_note = "pg_stat_statements is installed but not in shared_preload_libraries"
        return
    quoted = conn.dialect.identifier_preparer.quote_identifier(str(schema))
    mean = "mean_exec_time" if int(_scalar(conn, "SHOW server_version_num")) >= 130000 else "mean_time"
    try:
        with _optional(conn):
            rows = _rows(
                conn,
                f"SELECT query, calls, {mean} FROM {quoted}.pg_stat_statements WHERE dbid = "
                "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (query ILIKE '%insert into asset_dag_run_queue%' OR query = '<insufficient privilege>')",
            )
    except DBAPIError as exc:
        exposure.queue_inserts_note = f"pg_stat_statements unreadable: {_first_line(exc)}"
        return
    if any(r[0] == "<insufficient privilege>" for r in rows):
        warnings.append(
            "pg_stat_statements hides other users' queries from this user (grant pg_read_all_stats)"
        )
    totals: dict[str, list[float]] = {}
    for query, calls, mean_ms in rows:
        if query == "<insufficient privilege>":
            continue
        total = totals.setdefault(_classify_insert(str(query)), [0, 0.0])
        total[0] += int(calls)
        total[1] += int(calls) * float(mean_ms)
    exposure.queue_inserts = [
        QueueInsert(kind, int(calls), (time / calls) if calls else 0.0)
        for kind, (calls, time) in totals.items()
    ]
    if not exposure.queue_inserts:
        exposure.queue_inserts_note = "pg_stat_statements has no insert into asset_dag_run_queue yet"


def _mysql_stats(conn: Connection, exposure: Exposure) -> None:
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).first()
    if row is not None:
        exposure.deadlocks = int(row[1])
        exposure.deadlocks_scope = "Innodb_deadlocks: the whole server, any table, since it started"


# --- the verdict ------------------------------------------------------------------


def _verdict(compat_: Compatibility, exposure: Exposure | None) -> tuple[str, list[str]]:
    if not compat_.supported:
        return NOT_SUPPORTED, [compat_.support]
    if compat_.backend == "sqlite":
        return NOT_NEEDED, [
            "SQLite runs one writer at a time: two transactions never hold queue-row locks together, so "
            "there is no deadlock to remove (and Airflow does not support SQLite in production)"
        ]
    if compat_.queue_key is not None and set(compat_.queue_key) == {"target_dag_id", "asset_event_id"}:
        reason = (
            "this queue is keyed by (target_dag_id, asset_event_id): concurrent producers insert different "
            "rows and cannot deadlock on them"
        )
        if exposure is not None and exposure.fanout_max > FANOUT_THRESHOLDS[0]:
            reason += (
                "; the plug-in still saves loading every consumer DAG per event "
                f"(up to {exposure.fanout_max:,} here)"
            )
        return NOT_NEEDED, [reason]
    assert exposure is not None
    reasons = []
    if exposure.racing:
        reasons.append(
            f"{_count(exposure.racing, 'asset')} with 2+ consumer DAGs produced by several tasks: two "
            "producers lock the same queue rows in Python set order, which differs between processes"
        )
    if exposure.multi_outlet_shared:
        reasons.append(
            f"{_count(exposure.multi_outlet_shared, 'task')} with several outlets sharing a consumer DAG: "
            "two runs lock (A, dag) and (B, dag) in opposite orders"
        )
    if exposure.multi_consumer_assets and not exposure.racing:
        reasons.append(
            f"{_count(exposure.multi_consumer_assets, 'asset')} with 2+ consumer DAGs (max "
            f"{exposure.fanout_max:,}): events for one of them racing each other (several runs, mapped "
            "tasks, the REST API) lock its queue rows in different orders"
        )
    if exposure.multi_outlet_multirow and not reasons:
        reasons.append(
            f"{_count(exposure.multi_outlet_multirow, 'task')} with several outlets queueing 2+ rows per "
            "success: two runs lock them in different orders"
        )
    if exposure.alias_multirow:
        reasons.append(f"{_count(exposure.alias_multirow, 'alias', 'aliases')} queueing 2+ rows per event")
    if not reasons:
        if not exposure.assets_with_consumers and not exposure.alias_references:
            return NOT_NEEDED, ["no unpaused DAG is scheduled on an asset: nothing is queued"]
        return NOT_NEEDED, [
            "no transaction can write two queue rows: every asset has at most one consumer DAG, no task's "
            "outlets reach two, and no alias event queues two"
        ]
    if exposure.deadlocks and compat_.backend == "postgresql":
        reasons.append(
            f"PostgreSQL has counted {_count(exposure.deadlocks, 'deadlock')} ({exposure.deadlocks_scope})"
        )
    return ENABLE, reasons


# --- check ------------------------------------------------------------------------


def check(url: str | URL, schema: str | None = None) -> Report:
    """Read the Airflow metadata database at ``url`` (read-only) and return the report.

    ``schema``: where Airflow's tables are, if not in the default schema
    (``[database] sql_alchemy_schema``; PostgreSQL).

    Raises :class:`DoctorError` when it is no Airflow metadata database or
    cannot be read.
    """
    url = sa.make_url(url)
    backend = _backend(url)
    warnings: list[str] = []
    try:
        with read_only_connection(url, schema) as conn:
            inspector = sa.inspect(conn)
            tables = set(inspector.get_table_names(schema=schema))
            if schema and "alembic_version" not in tables:
                # Airflow's migrations keep their version table in the default schema.
                tables |= {"alembic_version"} & set(inspector.get_table_names())
            revision = _alembic_revision(conn, tables)
            version = schema_version(revision)
            if version.airflow_version is not None and not version.complete:
                warnings.append(
                    f"alembic_version {revision} is not the last migration of Airflow "
                    f"{version.airflow_version}: was `airflow db migrate` interrupted?"
                )
            found: shapes.QueueShape | None = None
            shape_error = None
            queue_key = None
            if "asset_dag_run_queue" in tables:
                pk = (
                    inspector.get_pk_constraint("asset_dag_run_queue", schema=schema).get(
                        "constrained_columns"
                    )
                    or []
                )
                queue_key = tuple(pk)
            try:
                found = shapes.detect(conn, schema=schema)
            except UnsupportedSchemaError as exc:
                shape_error = str(exc)
            supported, why, tested = _support(version, found, shape_error)
            warnings.extend(_below_minimum(version))
            compatibility = Compatibility(
                backend=backend,
                server=_server(conn, backend),
                schema=version,
                queue_key=queue_key,
                shape=found.name if found else None,
                shape_lines=[f"{a}.{b}" for (a, b), made in compat.SHAPES.items() if made == found],
                supported=supported,
                support=why,
                tested=tested,
            )
            if "dag" in tables:
                compatibility.dag_id_collations = _collations(conn, backend)
            if backend == "mysql":
                compatibility.isolation, more = _mysql_isolation(conn, url)
                warnings.extend(more)
                compatibility.storage_engine = _scalar(
                    conn,
                    "SELECT engine FROM information_schema.tables WHERE table_schema = DATABASE() "
                    "AND table_name = 'asset_dag_run_queue'",
                )
                if "mariadb" in compatibility.server.lower():
                    warnings.append("Airflow does not support MariaDB (airflow-adrq's tests run on it)")
            if backend == "postgresql":
                compatibility.pgbouncer = _pgbouncer(conn)
            exposure = None
            needed = {
                "asset",
                "asset_active",
                "dag",
                "dag_schedule_asset_reference",
                "dag_schedule_asset_name_reference",
                "dag_schedule_asset_uri_reference",
                "dag_schedule_asset_alias_reference",
                "asset_alias",
                "asset_alias_asset",
            }
            if needed <= tables:
                if found is None:
                    # A schema the plug-in cannot write still has an exposure:
                    # filter consumers by the columns it has.
                    dag_columns = {c["name"] for c in inspector.get_columns("dag", schema=schema)}
                    found = shapes.QueueShape(
                        "unsupported",
                        partitions="timetable_partitioned" in dag_columns,
                        draining="is_draining" in dag_columns,
                    )
                exposure = _exposure(conn, tables, found)
                if backend == "postgresql":
                    _postgresql_stats(conn, exposure, warnings)
                elif backend == "mysql":
                    _mysql_stats(conn, exposure)
    except SQLAlchemyError as exc:
        raise DoctorError(f"cannot read {_safe(url)}: {_first_line(exc)}") from exc
    if exposure is None and supported:
        # Supported schemas always have these tables.
        raise DoctorError("the asset and schedule-reference tables are missing: not an Airflow 3 database")
    verdict, reasons = _verdict(compatibility, exposure)
    return Report(_safe(url), compatibility, exposure, verdict, reasons, warnings)


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- rendering ----------------------------------------------------------------------


_WIDTH = 100


def _n(value: int) -> str:
    return f"{value:,}"


def _count(value: int, singular: str, plural: str | None = None) -> str:
    return f"{value:,} {singular if value == 1 else plural or singular + 's'}"


def render_text(report: Report) -> str:
    """The report as text, about 25 lines."""
    c, e = report.compatibility, report.exposure
    lines = [f"airflow-adrq doctor: {report.url} (read-only)", "", "Compatibility"]

    def row(label: str, value: str) -> None:
        lines.extend(
            textwrap.wrap(value, _WIDTH, initial_indent=f"  {label:<19} ", subsequent_indent=" " * 22)
        )

    s = c.schema
    if s.airflow_version:
        row("Airflow schema", f"{s.airflow_version} (alembic_version {s.revision})")
    else:
        row("Airflow schema", f"unknown (alembic_version {s.revision})")
    key = f"({', '.join(c.queue_key)})" if c.queue_key else "none"
    if c.shape_lines:
        key += f": as in Airflow {', '.join(c.shape_lines)}"
    elif c.shape:
        key += f": {c.shape}"
    row("Queue key", key)
    row("Plug-in", ("supported: " if c.supported else "NOT supported: ") + c.support)
    row("Server", c.server + (f", asset_dag_run_queue on {c.storage_engine}" if c.storage_engine else ""))
    if c.isolation:
        row("Isolation", c.isolation)
    if c.dag_id_collations:
        distinct = sorted(set(c.dag_id_collations.values()))
        row(
            "dag_id collation",
            distinct[0]
            if len(distinct) == 1
            else "; ".join(f"{k} {v}" for k, v in c.dag_id_collations.items()),
        )
    if c.pgbouncer is not None:
        p = c.pgbouncer
        if p.detected:
            mode = f"{p.pool_mode} pooling ({p.pool_mode_how})" if p.pool_mode else "pool mode unknown"
            row("PgBouncer", f"yes, {mode}; {p.how}")
        elif p.detected is None:
            row("PgBouncer", f"cannot tell: {p.how}")
        else:
            row("PgBouncer", p.how if p.how.startswith("no") else f"no: {p.how}")
    lines.append("Exposure")
    if e is None:
        lines.append("  n/a: the asset tables are missing")
    else:
        row(
            "Assets",
            f"{_n(e.assets)} active, {_n(e.assets_with_consumers)} with consumer DAGs "
            "(unpaused; direct, name, URI references)",
        )
        over = ", ".join(f">{_n(n)}: {_n(k)}" for n, k in e.fanout_over.items())
        row(
            "Consumers/asset",
            f"max {_n(e.fanout_max)}, p50 {_n(e.fanout_p50)}, p99 {_n(e.fanout_p99)}; assets with {over}",
        )
        row(
            "Several producers",
            f"{_count(e.several_producers, 'asset')} ({_n(e.several_producer_dags)} by several DAGs), "
            f"{_n(e.racing)} of them with 2+ consumer DAGs: these race",
        )
        row(
            "Multi-outlet tasks",
            f"{_n(e.multi_outlet_tasks)}; {_n(e.multi_outlet_multirow)} queue 2+ rows "
            f"per success; {_n(e.multi_outlet_shared)} share a consumer DAG between outlets",
        )
        row(
            "Aliases",
            f"{_n(e.aliases)}; {_n(e.alias_references)} DAG schedule references, "
            f"{_n(e.alias_links)} asset links; {_n(e.alias_multirow)} queue 2+ rows per event",
        )
        if e.deadlocks is not None:
            row("Deadlocks", f"{_n(e.deadlocks)} ({e.deadlocks_scope})")
        if c.backend == "postgresql":
            if e.queue_inserts:
                for i, q in enumerate(sorted(e.queue_inserts, key=lambda q: q.kind)):
                    row(
                        "" if i else "Queue inserts",
                        f"{q.kind}: {_n(q.calls)} calls, mean {q.mean_ms:.2f} ms",
                    )
            else:
                row("Queue inserts", f"n/a: {e.queue_inserts_note}")
    for warning in report.warnings:
        lines.extend(textwrap.wrap(warning, _WIDTH, initial_indent="  ! ", subsequent_indent="    "))
    lines.append(f"Verdict: {report.verdict.upper()} (exit {report.exit_code})")
    for reason in report.reasons:
        lines.extend(textwrap.wrap(reason, _WIDTH, initial_indent="  - ", subsequent_indent="    "))
    advice = {
        ENABLE: "Enable it, in airflow.cfg on every component that writes asset events:",
        NOT_NEEDED: "Nothing to do; it is safe to enable anyway with:",
        NOT_SUPPORTED: "Do not set (and remove, if set):",
    }[report.verdict]
    lines.extend([f"  {advice}", f"    {CONFIG_SECTION}", f"    {CONFIG_LINE}"])
    return "\n".join(lines)


def render_json(report: Report) -> str:
    """The report as JSON (every field of :class:`Report`, plus ``exit_code`` and the config line)."""
    data = dataclasses.asdict(report)
    data["exit_code"] = report.exit_code
    data["config"] = {
        "section": "core",
        "option": "asset_manager_class",
        "value": CONFIG_LINE.split(" = ")[1],
    }
    return json.dumps(data, indent=2, default=str)


# --- command line -------------------------------------------------------------------


def airflow_url() -> str:
    """Airflow's ``[database] sql_alchemy_conn``: from the environment, else from Airflow's configuration.

    Raises :class:`DoctorError` when Airflow is not importable here.
    """
    from_env = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").strip()
    if from_env:
        return from_env
    try:
        from airflow.configuration import conf
    except ImportError as exc:
        raise DoctorError(
            "no --url, and Airflow is not importable here to read [database] sql_alchemy_conn: "
            "pass --url with Airflow's metadata database URL"
        ) from exc
    return str(conf.get("database", "sql_alchemy_conn"))


def airflow_schema() -> str | None:
    """Airflow's ``[database] sql_alchemy_schema``: from the environment, else Airflow's configuration."""
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA" in os.environ:
        return os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA"].strip() or None
    if importlib.util.find_spec("airflow.configuration") is None:
        return None
    from airflow.configuration import conf

    return str(conf.get("database", "sql_alchemy_schema", fallback="")).strip() or None


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor``."""
    parser = subparsers.add_parser(
        "doctor",
        help="read-only check: should this Airflow deployment enable the plug-in?",
        description="Reads an Airflow metadata database in one read-only transaction and reports "
        "compatibility, exposure to the asset_dag_run_queue deadlock, and a verdict. Exit status: "
        "0 enable, 1 not needed, 2 not supported, 3 no report (not an Airflow database, unreadable).",
    )
    parser.add_argument(
        "--url",
        help="SQLAlchemy URL of Airflow's metadata database (default: Airflow's [database] "
        "sql_alchemy_conn, when Airflow is importable here)",
    )
    parser.add_argument(
        "--schema",
        help="PostgreSQL schema of Airflow's tables (default: Airflow's [database] sql_alchemy_schema, "
        "from AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA or Airflow's configuration when importable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace, *, out: Callable[[str], None] = print) -> int:
    try:
        url = args.url or airflow_url()
        report = check(url, args.schema if args.schema is not None else airflow_schema())
    except DoctorError as exc:
        print(f"airflow-adrq doctor: {exc}", file=sys.stderr)
        return EXIT_NO_REPORT
    out(render_json(report) if args.json else render_text(report))
    return report.exit_code
