"""Whole-transaction retry, and the one place database errors are classified.

A deadlock victim's transaction is gone: PostgreSQL aborts it, InnoDB rolls
it back entirely (and discards its SAVEPOINTs, so MariaDB/MySQL then report
error 1305 "SAVEPOINT ... does not exist" with the 1213 further down the
exception chain). The only safe retry starts again from BEGIN and re-runs
the logic that chose the SQL; anything that is not a database write (listener
callbacks, metrics, messages) runs once, after the COMMIT that succeeded.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar, cast

from sqlalchemy import Table, event, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from airflow_adrq import queue
from airflow_adrq.errors import CommitOutcomeUnknownError, RetriesExhaustedError
from airflow_adrq.models import AssetEvent

__all__ = [
    "Retryable",
    "RetryableKind",
    "classify",
    "commit_outcome",
    "is_retryable",
    "run_callbacks",
    "run_in_transaction",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Callback = Callable[[], object]


class RetryableKind(enum.Enum):
    DEADLOCK = "deadlock"
    SERIALIZATION = "serialization"
    LOCK_TIMEOUT = "lock_timeout"
    BUSY = "busy"
    #: The connection was lost. Retryable only if COMMIT had not been sent:
    #: :func:`run_in_transaction` raises CommitOutcomeUnknownError otherwise.
    CONNECTION_LOST = "connection_lost"


@dataclass(frozen=True)
class Retryable:
    """A database error after which the whole transaction may be retried."""

    kind: RetryableKind
    code: str  # SQLSTATE, MySQL error number or SQLite result code, as text


# PostgreSQL SQLSTATEs (Appendix A, "PostgreSQL Error Codes").
_PG_SQLSTATES = {
    "40P01": RetryableKind.DEADLOCK,  # deadlock_detected
    "40001": RetryableKind.SERIALIZATION,  # serialization_failure
    "55P03": RetryableKind.LOCK_TIMEOUT,  # lock_not_available (lock_timeout / NOWAIT)
    "57P01": RetryableKind.CONNECTION_LOST,  # admin_shutdown (pg_terminate_backend, server stop)
    "57P02": RetryableKind.CONNECTION_LOST,  # crash_shutdown
    "57P03": RetryableKind.CONNECTION_LOST,  # cannot_connect_now (server starting up)
}
# SQLSTATE class 08: connection exceptions (PgBouncer reports lost server connections so).
_PG_CONNECTION_CLASS = "08"
# MySQL / MariaDB server error numbers.
_MYSQL_ERRNOS = {
    1213: RetryableKind.DEADLOCK,  # ER_LOCK_DEADLOCK: InnoDB rolled the transaction back
    1205: RetryableKind.LOCK_TIMEOUT,  # ER_LOCK_WAIT_TIMEOUT: only the statement was rolled back
    1927: RetryableKind.CONNECTION_LOST,  # ER_CONNECTION_KILLED (MariaDB: KILL CONNECTION)
    2006: RetryableKind.CONNECTION_LOST,  # CR_SERVER_GONE_ERROR
    2013: RetryableKind.CONNECTION_LOST,  # CR_SERVER_LOST (during a query)
    4031: RetryableKind.CONNECTION_LOST,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
}
# SQLite primary result codes (the low byte of extended codes such as
# SQLITE_BUSY_SNAPSHOT = 517).
_SQLITE_CODES = {
    5: RetryableKind.BUSY,  # SQLITE_BUSY
    6: RetryableKind.BUSY,  # SQLITE_LOCKED
}
# Python 3.10's sqlite3 exposes no result code, only the message, which for
# these results is SQLite's fixed sqlite3_errstr() text of the code. The one
# place we read text: exact, whole strings that stand for a result code.
_SQLITE_ERRSTR = {
    "database is locked": 5,  # sqlite3_errstr(SQLITE_BUSY)
    "database table is locked": 6,  # sqlite3_errstr(SQLITE_LOCKED)
}


# DBAPI drivers whose exceptions count as database errors (besides SQLAlchemy's own).
_DRIVER_MODULES = frozenset({"psycopg2", "psycopg", "MySQLdb", "pymysql", "sqlite3", "_sqlite3"})


def _is_database_error(exc: BaseException) -> bool:
    # RetriesExhaustedError only wraps the last database error (raised from it).
    if isinstance(exc, (SQLAlchemyError, sqlite3.Error, RetriesExhaustedError)):
        return True
    return type(exc).__module__.split(".")[0] in _DRIVER_MODULES


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the DBAPI error it wraps and what they were raised from or while handling.

    Database errors only: a ``ValueError`` raised by user code while handling
    a deadlock is the user's error, not a deadlock, and ends the walk.
    """
    if not _is_database_error(exc):
        return
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException) and _is_database_error(linked):
                todo.append(linked)


def _classify_one(exc: BaseException) -> Retryable | None:
    # SQLAlchemy asked the dialect (is_disconnect) and invalidated the
    # connection: the pool will not hand it out again.
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return Retryable(RetryableKind.CONNECTION_LOST, "invalidated")
    # psycopg2 exposes .pgcode, psycopg 3 .sqlstate.
    sqlstate = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate in _PG_SQLSTATES:
        return Retryable(_PG_SQLSTATES[sqlstate], sqlstate)
    if isinstance(sqlstate, str) and sqlstate.startswith(_PG_CONNECTION_CLASS):
        return Retryable(RetryableKind.CONNECTION_LOST, sqlstate)
    # sqlite3 (Python >= 3.11) exposes the extended result code.
    sqlite_code = getattr(exc, "sqlite_errorcode", None)
    if sqlite_code is None and isinstance(exc, sqlite3.OperationalError) and exc.args:
        sqlite_code = _SQLITE_ERRSTR.get(exc.args[0])
    if isinstance(sqlite_code, int):
        kind = _SQLITE_CODES.get(sqlite_code & 0xFF)
        return Retryable(kind, str(sqlite_code)) if kind else None
    # mysqlclient and PyMySQL: args[0] is the server's error number.
    if type(exc).__module__.split(".")[0] in ("MySQLdb", "pymysql") and exc.args:
        errno = exc.args[0]
        if isinstance(errno, int) and errno in _MYSQL_ERRNOS:
            return Retryable(_MYSQL_ERRNOS[errno], str(errno))
    return None


def classify(exc: BaseException) -> Retryable | None:
    """The retryable database error anywhere in ``exc``'s chain of database errors, or ``None``.

    Walks ``.orig``, ``__cause__`` and ``__context__`` through database errors
    only (MariaDB reports a deadlock inside a SAVEPOINT as 1305 with the 1213
    in ``__context__``) and reads driver error codes, never message text
    (except SQLite's fixed result-code strings on Python 3.10).
    """
    for linked in _chain(exc):
        found = _classify_one(linked)
        if found is not None:
            return found
    return None


def is_retryable(exc: BaseException) -> bool:
    """Whether :func:`classify` finds a retryable error; a lost connection counts."""
    return classify(exc) is not None


# Set by run_in_transaction around each attempt; the engine-wide "commit"
# listener flips it when a COMMIT is about to go to the server (SQLAlchemy
# emits ConnectionEvents.commit just before calling the DBAPI commit()).
_COMMIT_SENT: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "airflow_adrq_commit_sent", default=None
)


@event.listens_for(Engine, "commit")
def _on_commit(_conn: Connection) -> None:
    sent = _COMMIT_SENT.get()
    if sent is not None:
        sent[0] = True


def run_in_transaction(
    session_factory: Callable[[], Session],
    work: Callable[[Session, list[Callback]], T],
    *,
    max_attempts: int = 5,
    initial_wait: float = 0.05,
    max_wait: float = 2.0,
    on_retry: Callable[[int, Retryable], None] | None = None,
) -> T:
    """Run ``work(session, callback_sink)`` in a fresh transaction; retry it from BEGIN.

    Each attempt opens a session from ``session_factory``, begins, calls
    ``work`` and commits. On a retryable error (:func:`classify`) the attempt
    is rolled back, its callbacks dropped, ``on_retry(attempt, retryable)``
    called, and the whole unit runs again after a jittered exponential backoff
    (``initial_wait`` doubling up to ``max_wait``), at most ``max_attempts``
    times. What ``work`` appends to ``callback_sink`` (e.g. through
    ``register_asset_change(callback_sink=...)``) runs once, after the COMMIT
    that succeeded (:func:`run_callbacks`).

    A connection lost before COMMIT was sent is retried on a new connection:
    nothing of that attempt was committed. Lost while COMMIT was in flight,
    the outcome is unknown and it is never retried: raises
    :class:`~airflow_adrq.errors.CommitOutcomeUnknownError` (from the driver
    error) with the ids of the transaction's asset events; find out with
    :func:`commit_outcome` before doing the work again.

    Locks: whatever ``work`` locks, released by each attempt's COMMIT or
    ROLLBACK. Does not promise: that ``work``'s side effects outside the
    database happen once (it may run several times; use the callback sink),
    or success: after ``max_attempts`` retryable failures it raises
    :class:`~airflow_adrq.errors.RetriesExhaustedError` from the last error.
    Other errors propagate unchanged after the rollback.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        found = classify(exc) if exc else None
        if found is not None:
            log.info(
                "retrying transaction after %s (%s), attempt %d",
                found.kind.value,
                found.code,
                state.attempt_number,
            )
            if on_retry is not None:
                on_retry(state.attempt_number, found)

    retrying = Retrying(
        stop=stop_after_attempt(max_attempts),
        wait=wait_random_exponential(multiplier=initial_wait, max=max_wait),
        retry=retry_if_exception(is_retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    callbacks: list[Callback] = []
    try:
        for attempt in retrying:
            with attempt:
                callbacks = []
                result = _attempt(session_factory, work, callbacks)
    except CommitOutcomeUnknownError:
        raise
    except Exception as exc:
        if is_retryable(exc):
            raise RetriesExhaustedError(
                f"transaction failed {max_attempts} times with retryable errors; last: {classify(exc)}"
            ) from exc
        raise
    run_callbacks(callbacks)
    return result


def _attempt(
    session_factory: Callable[[], Session],
    work: Callable[[Session, list[Callback]], T],
    callbacks: list[Callback],
) -> T:
    """One attempt: BEGIN, ``work``, COMMIT, telling a lost COMMIT apart from a lost transaction."""
    sent = [False]
    token = _COMMIT_SENT.set(sent)
    event_ids: list[int] = []
    try:
        with session_factory() as session, session.begin():
            result = work(session, callbacks)
            # What to look for if the COMMIT's outcome is lost.
            event_ids = queue.pending_events(session)
            sent[0] = False  # only the COMMIT that follows counts
        return result
    except Exception as exc:
        found = classify(exc)
        if sent[0] and found is not None and found.kind is RetryableKind.CONNECTION_LOST:
            error = CommitOutcomeUnknownError(
                "the database connection was lost while COMMIT was in flight; the transaction may or "
                f"may not have been committed ({found.code}). Not retried: check what was written "
                f"(asset_event ids {event_ids}; see airflow_adrq.retry.commit_outcome) before running "
                "it again."
            )
            error.event_ids = tuple(event_ids)
            raise error from exc
        raise
    finally:
        _COMMIT_SENT.reset(token)


def commit_outcome(session_factory: Callable[[], Session], error: CommitOutcomeUnknownError) -> bool | None:
    """Whether the transaction behind ``error`` was committed: ``True``, ``False``, or ``None`` (can't tell).

    Counts, on a new connection, the ``asset_event`` rows it registered
    (``error.event_ids``): all there, committed; none, not (the server rolls
    back a transaction whose connection died before its COMMIT completed);
    no ids, or only some, ``None``. Call it once the old connection is gone on
    the server (a killed session may still be rolling back). A plain SELECT;
    locks nothing.
    """
    ids = sorted(set(error.event_ids))
    if not ids:
        return None
    table = cast(Table, AssetEvent.__table__)
    with session_factory() as session:
        found = session.execute(
            select(func.count()).select_from(table).where(table.c.id.in_(ids))
        ).scalar_one()
    if found == len(ids):
        return True
    return False if found == 0 else None


def run_callbacks(callbacks: Iterable[Callback]) -> None:
    """Call each post-commit callback in order; a failure is logged and does not stop the rest."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("post-commit callback %r failed", callback)
