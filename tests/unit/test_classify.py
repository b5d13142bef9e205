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


def test_user_error_raised_while_handling_a_deadlock_is_not_retryable():
    # A ValueError from user code whose __context__ is a deadlock is the
    # user's error: retrying it would only end as RetriesExhaustedError.
    deadlock = _wrapped(MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock"))
    try:
        try:
            raise deadlock
        except sa.exc.OperationalError:
            raise ValueError("bad input found while handling the deadlock")  # noqa: B904
    except ValueError as exc:
        assert exc.__context__ is deadlock
        assert classify(exc) is None
    # The same deadlock raised *from* a database error still counts.
    try:
        try:
            raise deadlock
        except sa.exc.OperationalError as inner:
            raise sa.exc.InternalError("ROLLBACK", {}, RuntimeError("x")) from inner
    except sa.exc.InternalError as exc:
        assert classify(exc).kind is RetryableKind.DEADLOCK


class _FakeSession:
    """A session that begins and commits nothing: run_in_transaction's attempts without a database."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin(self):
        return self


def test_run_in_transaction_does_not_retry_a_user_error_over_a_deadlock():
    from airflow_adrq.retry import run_in_transaction

    calls = []

    def work(_session, _sink):
        calls.append(1)
        try:
            raise _wrapped(MySQLdb.OperationalError(1213, "Deadlock found"))
        except sa.exc.OperationalError:
            raise ValueError("user error") from None

    with pytest.raises(ValueError, match="user error"):
        run_in_transaction(_FakeSession, work, max_attempts=3, initial_wait=0)
    assert calls == [1]


def test_run_in_transaction_stops_at_its_deadline_or_stop_and_says_how_many_attempts():
    import time

    from airflow_adrq.errors import RetriesExhaustedError
    from airflow_adrq.retry import run_in_transaction

    calls = []

    def deadlocked(_session, _sink):
        calls.append(1)
        raise _wrapped(MySQLdb.OperationalError(1213, "Deadlock found"))

    with pytest.raises(RetriesExhaustedError, match="failed 1 times") as info:
        run_in_transaction(
            _FakeSession, deadlocked, max_attempts=50, initial_wait=0, deadline=time.monotonic()
        )
    assert calls == [1] and info.value.attempts == 1
    calls.clear()
    with pytest.raises(RetriesExhaustedError) as info:
        run_in_transaction(
            _FakeSession, deadlocked, max_attempts=50, initial_wait=0, stop=lambda: len(calls) >= 3
        )
    assert calls == [1, 1, 1] and info.value.attempts == 3
    calls.clear()
    with pytest.raises(RetriesExhaustedError) as info:
        run_in_transaction(_FakeSession, deadlocked, max_attempts=4, initial_wait=0)
    assert calls == [1, 1, 1, 1] and info.value.attempts == 4
