"""Per-dialect SQL differences: one plain module per backend, looked up by name.

Generic code asks :func:`get` for the :class:`DialectSupport` of a bind and
never compares dialect names itself. Each backend module
(``airflow_adrq.dialects.postgresql``, ``.mysql``, ``.sqlite``) defines one
``SUPPORT``; :data:`MODULES` maps SQLAlchemy's dialect names to them. Adding
a backend means adding a module and a line there.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from sqlalchemy import Column, ColumnElement, Select, Table
from sqlalchemy.engine import Connection, Dialect, Engine
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
    "resolve",
]

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
    """What differs between backends on the queueing path.

    ``insert_from_select(table, columns, select, key, on_conflict, refresh)``
    returns ``INSERT INTO table (columns) <select>`` with the backend's
    conflict clause on the primary key ``key``:

    * ``"ignore"``: an existing row is left untouched;
    * ``"refresh"``: the existing row's ``refresh`` column becomes the greater
      of its value and the new one (never moves backwards).

    ``insert_ignore(table)`` is an ``INSERT`` (add ``.values()``) that leaves
    an existing row with the same primary key untouched.

    ``engine_kwargs`` and ``configure_engine(engine)`` are the connection
    settings the guarantees rely on (isolation level, busy handling, FK
    enforcement); :func:`airflow_adrq.engine.create_engine` applies both.

    ``check_connection(connection)`` runs before every queue write and raises
    :class:`~airflow_adrq.errors.AdrqError` for a connection whose settings
    break those guarantees (MySQL/MariaDB above READ COMMITTED). It must be
    cheap: cache per DBAPI connection.

    ``refresh_by_default(connection)`` says whether ``on_conflict="auto"`` is
    ``"refresh"`` on this connection: whether Airflow's scheduler locks the
    queue rows it consumes (``FOR UPDATE SKIP LOCKED``) before deleting them,
    so that a producer refreshing a row only ever waits for the scheduler,
    never the other way round. Where it takes no row locks (MariaDB), it
    deletes the rows DAG by DAG in Python-set order while a refresh locks them
    in key order: the two deadlock, so ``"auto"`` is ``"refresh_after_commit"``
    there (never waiting: :mod:`airflow_adrq.refresh`).

    ``clock()`` is the database's clock as a SQL expression with one value
    per statement (``None``: Python's, for a database on the caller's host);
    the queue's stamp is read from it once the rows are locked
    (:func:`airflow_adrq.queue.queue_events`). ``stamp_in_one_statement``:
    the backend runs data-modifying CTEs, so the stamp goes on the events
    and the rows in the statement that reads it.

    ``lock_order(dag_id)`` is the sort key under which the queue write
    share-locks its consumers' ``dag`` rows (``None``: the backend has one
    writer at a time and takes no row locks); it must be the order Airflow's
    other writers of ``dag`` lock rows in, Python's ``sorted()`` of the ids
    (the DAG processor's flushes): byte order, whatever the database's
    collation. ``lock_by_id_list``: the consumers are read first and locked
    by their id list (InnoDB locks a locking read's rows in access order, not
    in ``ORDER BY`` order; an ``IN`` list on the primary key is accessed in
    the key's order). ``clock_after_locks()``: a clock read when it is
    evaluated, not when the statement starts, for the one-statement write
    (:func:`airflow_adrq.queue.queue_events`) that reads it once its share
    locks are held.
    """

    name: str
    insert_from_select: Callable[
        [Table, Sequence[Column[Any]], Select[Any], Sequence[str], ConflictMode, str], Insert
    ]
    insert_ignore: Callable[[Table], Insert]
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    configure_engine: Callable[[Engine], None] = field(default=lambda engine: None)
    check_connection: Callable[[Connection], None] = field(default=lambda connection: None)
    clock: Callable[[], ColumnElement[dt.datetime]] | None = None
    stamp_in_one_statement: bool = False
    refresh_by_default: Callable[[Connection], bool] = field(default=lambda connection: True)
    lock_order: Callable[[ColumnElement[str]], ColumnElement[Any]] | None = None
    lock_by_id_list: bool = False
    clock_after_locks: Callable[[], ColumnElement[dt.datetime]] | None = None
    #: Whether a database error is "lock not available" (a ``NOWAIT`` that met a held row).
    lock_not_available: Callable[[BaseException], bool] = field(default=lambda error: False)
    #: DDL is transactional: a failed migration's rollback undoes it (not MySQL/MariaDB,
    #: where each DDL statement commits; :mod:`airflow_adrq.migrate` cleans up there).
    transactional_ddl: bool = True
    #: Raises :class:`~airflow_adrq.errors.AdrqError` before any DDL of airflow-adrq's
    #: migrations on a server whose settings would make the tables differ from Airflow's.
    check_before_ddl: Callable[[Connection], None] = field(default=lambda connection: None)


#: SQLAlchemy dialect name -> the module of this package that supports it. Imported on first
#: use, not with the package: each imports its SQLAlchemy dialect extension.
MODULES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


def get(bind: Session | Connection | Engine | Dialect | str) -> DialectSupport:
    """The :class:`DialectSupport` for a session, connection, engine or dialect.

    Raises :class:`~airflow_adrq.errors.UnsupportedDialectError` for a backend
    not in :data:`MODULES`.
    """
    if isinstance(bind, str):
        name = bind
    elif isinstance(bind, Session):
        name = bind.get_bind().dialect.name
    elif isinstance(bind, Dialect):
        name = bind.name
    else:
        name = bind.dialect.name
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
    """What ``policy`` means on ``connection`` (``"auto"``: the backend's safe choice)."""
    policy = check_policy(policy)
    if policy == "auto":
        return "refresh" if get(connection).refresh_by_default(connection) else "refresh_after_commit"
    return policy
