"""Per-dialect SQL differences: one plain module per backend, looked up by name.

Generic code asks :func:`get` for the :class:`DialectSupport` of a bind and never compares dialect
names itself. Each backend module defines one ``SUPPORT``; adding a backend means adding a module
and a line in :data:`MODULES`.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from sqlalchemy import Column, ColumnElement, Select, Table, func
from sqlalchemy.engine import Connection, CursorResult, Dialect, Engine
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from airflow_adrq.errors import UnsupportedDialectError

__all__ = [
    "CONFLICT_POLICIES",
    "MODULES",
    "ConflictMode",
    "ConflictPolicy",
    "DialectSupport",
    "ResolvedPolicy",
    "check_policy",
    "get",
    "on_conflict_insert_from_select",
    "resolve",
]

log = logging.getLogger(__name__)

#: What the statement does with an existing queue row (see DialectSupport).
ConflictMode = Literal["ignore", "refresh"]
#: What a caller asks for: ``"refresh"`` in the statement, ``"ignore"``, ``"refresh_after_commit"``
#: (the statement ignores, separate statements refresh after COMMIT: :mod:`airflow_adrq.refresh`),
#: or ``"auto"``, the backend's safe choice (:func:`resolve`).
ConflictPolicy = Literal["auto", "ignore", "refresh", "refresh_after_commit"]
#: A policy with ``"auto"`` resolved.
ResolvedPolicy = Literal["ignore", "refresh", "refresh_after_commit"]
CONFLICT_POLICIES: tuple[ConflictPolicy, ...] = ("auto", "ignore", "refresh", "refresh_after_commit")


@dataclass(frozen=True)
class DialectSupport:
    """What differs between backends on the queueing path (each backend module defines one)."""

    name: str
    #: ``(table, columns, select, key, on_conflict, column)``: ``INSERT INTO table (columns) <select>``
    #: with the conflict clause on the primary key ``key``: ``"ignore"`` leaves an existing row,
    #: ``"refresh"`` sets its ``column`` to the greater of its value and the new one.
    insert_from_select: Callable[
        [Table, Sequence[Column[Any]], Select[Any], Sequence[str], ConflictMode, str], Insert
    ]
    #: An ``INSERT`` (add ``.values()``) that leaves an existing row with the same key untouched.
    insert_ignore: Callable[[Table], Insert]
    #: The connection settings the guarantees rely on (isolation level, busy handling, FK enforcement),
    #: applied by :func:`airflow_adrq.engine.create_engine`.
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    configure_engine: Callable[[Engine], None] = field(default=lambda engine: None)
    #: Runs before every queue write (cheap: cached per DBAPI connection); raises
    #: :class:`~airflow_adrq.errors.AdrqError` for settings that break the guarantees.
    check_connection: Callable[[Connection], None] = field(default=lambda connection: None)
    #: The database's clock, one value per statement (``None``: Python's, a database on this host).
    clock: Callable[[], ColumnElement[dt.datetime]] | None = None
    #: Data-modifying CTEs: the stamp goes on the events and the rows in the statement reading it.
    stamp_in_one_statement: bool = False
    #: Whether ``"auto"`` is ``"refresh"``: whether Airflow's scheduler locks the queue rows it consumes
    #: (``FOR UPDATE SKIP LOCKED``), so a refreshing producer only waits for it. Else (MariaDB) it
    #: deletes DAG by DAG in set order, which a refresh in key order would deadlock with:
    #: ``"refresh_after_commit"`` (:mod:`airflow_adrq.refresh`).
    refresh_by_default: Callable[[Connection], bool] = field(default=lambda connection: True)
    #: The sort key of the consumers' ``dag`` share locks: the order Airflow's other ``dag`` writers
    #: lock in, Python's ``sorted()`` (byte order, whatever the collation). ``None``: one writer at a
    #: time, no row locks.
    lock_order: Callable[[ColumnElement[str]], ColumnElement[Any]] | None = None
    #: Read the consumers first, lock them by id list (InnoDB locks a locking read's rows in access
    #: order, not ``ORDER BY`` order; an ``IN`` list on the key is read in key order).
    lock_by_id_list: bool = False
    #: A clock read when evaluated, not at statement start: the one-statement write reads it once its
    #: share locks are held (:func:`airflow_adrq.queue.queue_events`).
    clock_after_locks: Callable[[], ColumnElement[dt.datetime]] | None = None
    #: The rows the queue statement just executed inserted or updated (its ``result``'s rowcount).
    rows_written: Callable[[Connection, CursorResult[Any]], int] = field(
        default=lambda connection, result: result.rowcount
    )
    #: DDL is transactional: a failed migration's rollback undoes it (not MySQL/MariaDB, where each
    #: DDL statement commits; :mod:`airflow_adrq.migrate` cleans up there).
    transactional_ddl: bool = True
    #: Raises :class:`~airflow_adrq.errors.AdrqError` before any DDL of airflow-adrq's migrations on
    #: a server whose settings would make the tables differ from Airflow's.
    check_before_ddl: Callable[[Connection], None] = field(default=lambda connection: None)


#: SQLAlchemy dialect name -> the module of this package that supports it. Imported on first use,
#: not with the package: each imports its SQLAlchemy dialect extension.
MODULES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


def get(bind: Session | Connection | Engine | Dialect | str) -> DialectSupport:
    """The :class:`DialectSupport` for a session, connection, engine or dialect (or its name).

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
    return cast(DialectSupport, importlib.import_module(f"{__name__}.{module}").SUPPORT)


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
    if (policy := check_policy(policy)) != "auto":
        resolved: ResolvedPolicy = policy
    else:
        resolved = "refresh" if get(connection).refresh_by_default(connection) else "refresh_after_commit"
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
