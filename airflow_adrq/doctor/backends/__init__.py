"""What doctor reads differently on each backend, behind one small registry.

Generic modules ask :func:`get` for the :class:`Probe` of a URL or backend
name and never compare backend names themselves. Each backend module
registers itself with :func:`register`; adding a backend means adding a
module here (as in :mod:`airflow_adrq.dialects`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection

from airflow_adrq.dialects import Registry
from airflow_adrq.doctor.report import Compatibility, DoctorError, Exposure

__all__ = [
    "CONNECT_TIMEOUT",
    "DAG_ID_COLUMNS",
    "Probe",
    "connect_timeout",
    "get",
    "information_schema_collations",
    "register",
]

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
    """How doctor reads one backend.

    ``name`` is the report's ``compatibility.backend`` (``"mysql"`` for MariaDB too).
    ``engine_args(url)`` returns the URL and ``connect_args`` doctor's engine
    opens: a connect timeout, or (SQLite) the file read-only, never created.
    ``begin_read_only(connection)`` makes the connection's transaction
    read-only before its first query; ``search_path(connection, schema)``
    resolves unqualified names in ``schema`` first, for that transaction only
    (``None``: the backend has no such setting to check).

    ``server`` and ``collations`` fill the report's rows every backend has;
    ``compatibility(connection, compatibility)`` fills the backend's own
    fields (MySQL/MariaDB's isolation and storage engine, PostgreSQL's
    PgBouncer) and ``stats(connection, exposure)`` its counters (deadlocks,
    ``pg_stat_statements``); both return warnings.

    For the verdict: ``cannot_deadlock`` is why two transactions never hold
    queue-row locks together on this backend (SQLite's one writer), and
    ``deadlock_counter`` who counts this database's own deadlocks, cited as a
    reason to enable (``None``: no counter, or one that is not this database's).
    """

    name: str
    engine_args: Callable[[URL], tuple[URL, dict[str, Any]]]
    begin_read_only: Callable[[Connection], None]
    server: Callable[[Connection], str]
    collations: Callable[[Connection], dict[str, str]]
    search_path: Callable[[Connection, str], None] | None = None
    compatibility: Callable[[Connection, Compatibility], list[str]] = field(
        default=lambda connection, compatibility: []
    )
    stats: Callable[[Connection, Exposure], list[str]] = field(default=lambda connection, exposure: [])
    cannot_deadlock: str | None = None
    deadlock_counter: str | None = None


_REGISTRY: Registry[Probe] = Registry(
    __name__,
    ("mysql", "postgresql", "sqlite"),
    lambda name, known: DoctorError(
        f"{name} is not a database Airflow 3 runs on: doctor reads PostgreSQL, MySQL/MariaDB and SQLite"
    ),
)
#: Register a :class:`Probe` under one or more SQLAlchemy backend names.
register = _REGISTRY.register


def get(backend: str | URL) -> Probe:
    """The :class:`Probe` of a backend name or URL (:class:`DoctorError` if Airflow does not run on it)."""
    return _REGISTRY.lookup(backend if isinstance(backend, str) else backend.get_backend_name())


def connect_timeout(*drivers: str) -> Callable[[URL], tuple[URL, dict[str, Any]]]:
    """A :attr:`Probe.engine_args` that sets :data:`CONNECT_TIMEOUT` for the DBAPIs that take one."""

    def engine_args(url: URL) -> tuple[URL, dict[str, Any]]:
        return url, ({"connect_timeout": CONNECT_TIMEOUT} if url.get_driver_name() in drivers else {})

    return engine_args


def information_schema_collations(conn: Connection, schema: str, default: str | None) -> dict[str, str]:
    """The collation of each of :data:`DAG_ID_COLUMNS` in ``schema`` (an SQL expression) that exists.

    A column without one of its own shows ``default``.
    """
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
