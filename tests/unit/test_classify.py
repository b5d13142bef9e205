# mypy: ignore-errors
"""Error classification along the exception chain, with the drivers' own exception classes."""

from __future__ import annotations

import sqlite3

import MySQLdb
import pytest
import sqlalchemy as sa

from airflow_adrq.retry import RetryableKind, classify


def _wrapped(orig):
    """What SQLAlchemy raises: its own exception, from the DBAPI error."""
    try:
        raise sa.exc.OperationalError("SELECT 1", {}, orig) from orig
    except sa.exc.OperationalError as exc:
        return exc


def test_mariadb_savepoint_error_over_a_deadlock_is_a_deadlock():
    # InnoDB rolled the whole transaction back (1213); SQLAlchemy's ROLLBACK TO
    # SAVEPOINT then fails with 1305, raised while handling the 1213.
    try:
        try:
            raise _wrapped(MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock"))
        except sa.exc.OperationalError:
            raise _wrapped(MySQLdb.OperationalError(1305, "SAVEPOINT sa_savepoint_1 does not exist"))  # noqa: B904
    except sa.exc.OperationalError as exc:
        found = classify(exc)
    assert (found.kind, found.code) == (RetryableKind.DEADLOCK, "1213")


@pytest.mark.parametrize(
    ("errno", "kind"), [(1213, RetryableKind.DEADLOCK), (1205, RetryableKind.LOCK_TIMEOUT), (1062, None)]
)
def test_mysql_error_numbers(errno, kind):
    found = classify(_wrapped(MySQLdb.OperationalError(errno, "message text is never read")))
    assert (found.kind if found else None) is kind


def test_message_text_alone_is_not_classified():
    assert classify(RuntimeError("Deadlock found when trying to get lock; 40P01")) is None
    assert classify(_wrapped(sqlite3.OperationalError("database is locked, or something else"))) is None


def test_sqlite_result_code_strings_without_sqlite_errorcode():
    # Python 3.10's sqlite3 has no sqlite_errorcode; an exception built by hand
    # has none on any version, so this exercises that path everywhere.
    found = classify(_wrapped(sqlite3.OperationalError("database is locked")))
    assert (found.kind, found.code) == (RetryableKind.BUSY, "5")
