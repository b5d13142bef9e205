"""Which database errors a whole transaction may be retried after: the one classification.

Read from driver error codes (SQLSTATE, MySQL error numbers, SQLite result codes), never message
text, along the chain of database errors an exception carries. No dependency beyond SQLAlchemy: the
commit-time refresh (:mod:`airflow_adrq.refresh`) uses it inside every Airflow process, and the
whole-transaction retry (:mod:`airflow_adrq.retry`) builds on it.
"""

from __future__ import annotations

import enum
import sqlite3
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from airflow_adrq.errors import RetriesExhaustedError

__all__ = ["Retryable", "RetryableKind", "classify", "is_retryable"]


class RetryableKind(enum.Enum):
    DEADLOCK = "deadlock"
    SERIALIZATION = "serialization"
    LOCK_TIMEOUT = "lock_timeout"
    BUSY = "busy"
    #: The connection was lost. Retryable only if COMMIT had not been sent: :func:`run_in_transaction`
    #: raises CommitOutcomeUnknownError otherwise.
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
# MySQL / MariaDB server error numbers.
_MYSQL_ERRNOS = {
    1213: RetryableKind.DEADLOCK,  # ER_LOCK_DEADLOCK: InnoDB rolled the transaction back
    1205: RetryableKind.LOCK_TIMEOUT,  # ER_LOCK_WAIT_TIMEOUT: only the statement was rolled back
    1927: RetryableKind.CONNECTION_LOST,  # ER_CONNECTION_KILLED (MariaDB: KILL CONNECTION)
    2006: RetryableKind.CONNECTION_LOST,  # CR_SERVER_GONE_ERROR
    2013: RetryableKind.CONNECTION_LOST,  # CR_SERVER_LOST (during a query)
    4031: RetryableKind.CONNECTION_LOST,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
}
# SQLite primary result codes (the low byte of extended codes such as SQLITE_BUSY_SNAPSHOT = 517).
_SQLITE_CODES = {
    5: RetryableKind.BUSY,  # SQLITE_BUSY
    6: RetryableKind.BUSY,  # SQLITE_LOCKED
}
# Python 3.10's sqlite3 exposes only the message: for these results, SQLite's fixed sqlite3_errstr()
# text of the code. The one place we read text: exact, whole strings that stand for a result code.
_SQLITE_ERRSTR = {
    "database is locked": 5,  # sqlite3_errstr(SQLITE_BUSY)
    "database table is locked": 6,  # sqlite3_errstr(SQLITE_LOCKED)
}


# Database errors: SQLAlchemy's, sqlite3's, RetriesExhaustedError (it only wraps the last database
# error, raised from it), and any exception of these DBAPI drivers' modules.
_DATABASE_ERRORS = (SQLAlchemyError, sqlite3.Error, RetriesExhaustedError)
_DRIVER_MODULES = frozenset({"psycopg2", "psycopg", "MySQLdb", "pymysql", "sqlite3", "_sqlite3"})


def _is_database_error(exc: BaseException) -> bool:
    return isinstance(exc, _DATABASE_ERRORS) or type(exc).__module__.split(".")[0] in _DRIVER_MODULES


def _classify_one(exc: BaseException) -> Retryable | None:
    # SQLAlchemy asked the dialect (is_disconnect) and invalidated the connection: the pool will not
    # hand it out again.
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return Retryable(RetryableKind.CONNECTION_LOST, "invalidated")
    # psycopg2 exposes .pgcode, psycopg 3 .sqlstate. Class 08 (connection exceptions) is a lost
    # connection too (PgBouncer reports lost server connections so).
    sqlstate = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and (sqlstate in _PG_SQLSTATES or sqlstate.startswith("08")):
        return Retryable(_PG_SQLSTATES.get(sqlstate, RetryableKind.CONNECTION_LOST), sqlstate)
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

    Walks ``.orig``, ``__cause__`` and ``__context__`` through database errors only (MariaDB reports
    a deadlock inside a SAVEPOINT as 1305 with the 1213 in ``__context__``) and reads driver error
    codes, never message text (except SQLite's fixed result-code strings on Python 3.10). A
    ``ValueError`` raised by user code while handling a deadlock is the user's error, not a
    deadlock: the walk ends at anything that is no database error.
    """
    seen: set[int] = set()
    todo = [exc] if _is_database_error(exc) else []
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if (found := _classify_one(current)) is not None:
            return found
        links = (getattr(current, "orig", None), current.__cause__, current.__context__)
        todo += [link for link in links if isinstance(link, BaseException) and _is_database_error(link)]
    return None


def is_retryable(exc: BaseException) -> bool:
    """Whether :func:`classify` finds a retryable error; a lost connection counts."""
    return classify(exc) is not None
