"""Per-backend SQL and the queue write: one plain module per backend, looked up by name.

Generic code asks :func:`get` for the backend module of a bind and never compares dialect names
itself. Each backend module defines the names of :class:`Backend` as plain functions and values, and
its ``write``, which reads top to bottom in the order its statements are sent: :mod:`.postgresql`,
:mod:`.mysql` (MySQL 8 and MariaDB), :mod:`.sqlite`. Adding a backend means adding a module and a
line in :data:`MODULES`.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from sqlalchemy import Column, ColumnElement, Select, Table, func
from sqlalchemy.engine import Connection, CursorResult, Dialect, Engine
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from airflow_adrq.errors import UnsupportedDialectError

if TYPE_CHECKING:
    from airflow_adrq.metrics import Metrics
    from airflow_adrq.statement import Form

__all__ = [
    "CONFLICT_POLICIES",
    "MODULES",
    "Backend",
    "ConflictMode",
    "ConflictPolicy",
    "ResolvedPolicy",
    "check_policy",
    "get",
    "on_conflict_insert_from_select",
    "resolve",
]

log = logging.getLogger(__name__)

#: What the statement does with an existing queue row (see Backend.insert_from_select).
ConflictMode = Literal["ignore", "refresh"]
#: What a caller asks for: ``"refresh"`` in the statement, ``"ignore"``, ``"refresh_after_commit"``
#: (the statement ignores, separate statements refresh after COMMIT: :mod:`airflow_adrq.refresh`),
#: or ``"auto"``, the backend's safe choice (:func:`resolve`).
ConflictPolicy = Literal["auto", "ignore", "refresh", "refresh_after_commit"]
#: A policy with ``"auto"`` resolved.
ResolvedPolicy = Literal["ignore", "refresh", "refresh_after_commit"]
CONFLICT_POLICIES: tuple[ConflictPolicy, ...] = ("auto", "ignore", "refresh", "refresh_after_commit")


class Backend(Protocol):
    """What each backend module defines: plain functions and values, the same names in each.

    The queue write itself is :func:`write` (where the scheduler locks rows); what the rest of the
    package needs from a backend (engine settings, the conflict clause, the clock, DDL) is the rest.
    """

    #: The backend's name (``"postgresql"``, ``"mysql"`` for MySQL and MariaDB, ``"sqlite"``).
    name: str
    #: The connection settings the guarantees rely on, applied by :func:`airflow_adrq.engine.create_engine`.
    engine_kwargs: Mapping[str, Any]
    #: The airflow-adrq extra that installs this backend's drivers (``None``: in Python itself).
    driver_extra: str | None
    #: The database's clock, one value per statement (``None``: Python's, a database on this host).
    clock: Callable[[], ColumnElement[dt.datetime]] | None
    #: Data-modifying CTEs: the refresh path stamps its rows and the events in one statement.
    stamp_in_one_statement: bool
    #: DDL is transactional: a failed migration's rollback undoes it (not MySQL/MariaDB, where each
    #: DDL statement commits; :mod:`airflow_adrq.migrate` cleans up there).
    transactional_ddl: bool

    def configure_engine(self, engine: Engine) -> None:
        """Listeners an engine of :func:`airflow_adrq.engine.create_engine` needs (SQLite's BEGIN)."""

    def check_connection(self, connection: Connection) -> None:
        """Before every queue write (cached per DBAPI connection): :class:`AdrqError` for bad settings."""

    def check_before_ddl(self, connection: Connection) -> None:
        """Before airflow-adrq's migrations: :class:`AdrqError` if the tables would differ from Airflow's."""

    def refresh_by_default(self, connection: Connection) -> bool:
        """Whether ``"auto"`` is ``"refresh"``: whether Airflow's scheduler locks the rows it consumes."""

    def insert_from_select(
        self,
        table: Table,
        columns: Sequence[Column[Any]],
        select: Select[Any],
        key: Sequence[str],
        on_conflict: ConflictMode,
        refresh: str,
    ) -> Insert:
        """``INSERT INTO table (columns) <select>`` with the conflict clause on the primary key ``key``.

        ``"ignore"`` leaves an existing row, ``"refresh"`` sets its ``refresh`` column to the greater of
        its value and the new one.
        """

    def insert_ignore(self, table: Table) -> Insert:
        """An ``INSERT`` (add ``.values()``) that leaves an existing row with the same key untouched."""

    def rows_written(self, connection: Connection, result: CursorResult[Any]) -> int:
        """The rows the queue statement just executed inserted or updated."""

    def write(
        self,
        connection: Connection,
        form: Form,
        chunk_params: list[dict[str, Any]],
        options: Mapping[str, Any],
        lock_wait_s: float,
        metrics: Metrics,
    ) -> tuple[dt.datetime, int]:
        """The queue write where Airflow's scheduler locks rows: the consumers' ``dag`` rows share-locked,
        the clock read, the events stamped and the rows written; the stamp and the rows written."""


#: SQLAlchemy dialect name -> the module of this package that supports it. Imported on first use,
#: not with the package: each imports its SQLAlchemy dialect extension.
MODULES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


def get(bind: Session | Connection | Engine | Dialect | str) -> Backend:
    """The backend module for a session, connection, engine or dialect (or its name).

    Raises :class:`~airflow_adrq.errors.UnsupportedDialectError` for a backend not in :data:`MODULES`.
    """
    if isinstance(bind, Session):
        bind = bind.get_bind()
    dialect = bind if isinstance(bind, str | Dialect) else bind.dialect
    name = dialect if isinstance(dialect, str) else dialect.name
    module = MODULES.get(name)
    if module is None:
        raise UnsupportedDialectError(
            f"no airflow-adrq support for dialect {name!r} (supported: {', '.join(sorted(MODULES))})"
        )
    return cast(Backend, importlib.import_module(f"{__name__}.{module}"))


def check_policy(policy: object) -> ConflictPolicy:
    """``policy`` if it is a :data:`ConflictPolicy`; else :class:`ValueError` naming the choices."""
    if policy not in CONFLICT_POLICIES:
        raise ValueError(
            f"on_conflict must be one of {', '.join(map(repr, CONFLICT_POLICIES))}, not {policy!r}"
        )
    return policy


def resolve(policy: ConflictPolicy, connection: Connection) -> ResolvedPolicy:
    """What ``policy`` means on ``connection`` (``"auto"``: the backend's safe choice).

    Logs the value in force once per process for each policy and backend.
    """
    if policy != "auto":
        resolved: ResolvedPolicy = check_policy(policy)  # type: ignore[assignment]
    elif get(connection).refresh_by_default(connection):
        resolved = "refresh"
    else:
        resolved = "refresh_after_commit"
    _log_in_force(policy, resolved, connection.dialect.name)
    return resolved


@functools.cache
def _log_in_force(policy: ConflictPolicy, resolved: ResolvedPolicy, backend: str) -> None:
    log.info("airflow-adrq: on_conflict=%s is %r on %s", policy, resolved, backend)


def on_conflict_insert_from_select(
    insert: Callable[[Table], Any],
    greatest: str,
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
    """``insert_from_select`` of the ``INSERT ... ON CONFLICT`` backends (PostgreSQL, SQLite).

    Their ``Insert`` constructs share the ``on_conflict_do_*`` API: bind the backend's ``insert`` and
    two-argument maximum (``greatest``, SQLite's scalar ``max``) with ``functools.partial``.
    """
    stmt = insert(table).from_select(list(columns), select)
    if on_conflict == "ignore":
        return stmt.on_conflict_do_nothing(index_elements=list(key))  # type: ignore[no-any-return]
    # Only move the timestamp forwards; the WHERE keeps an unchanged row from being rewritten
    # (PostgreSQL still locks it, as DO UPDATE does).
    new_value = getattr(func, greatest)(table.c[refresh], stmt.excluded[refresh])
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=list(key),
        set_={refresh: new_value},
        where=table.c[refresh] < stmt.excluded[refresh],
    )
