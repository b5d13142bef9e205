"""Whole-transaction retry against real deadlocks and real SQLite lock contention."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from airflow_adrq import (
    RetriesExhaustedError,
    add_listener,
    classify,
    create_engine,
    register_asset_change,
    remove_listener,
    run_in_transaction,
)
from airflow_adrq.metrics import Recorded
from airflow_adrq.models import DagModel
from airflow_adrq.retry import RetryableKind
from tests.factories import add_asset, add_dags, asset_ref, events, queued, schedule_on_asset


def _touch(session, dag_id):
    session.execute(sa.update(DagModel).where(DagModel.dag_id == dag_id).values(max_active_runs=1))


@pytest.mark.slow
@pytest.mark.backends("postgresql", "mysql")
@pytest.mark.parametrize("inside_savepoint", [False, True], ids=["plain", "savepoint"])
def test_real_deadlock_is_retried_from_begin_exactly_once(engine, inside_savepoint):
    """Two transactions lock two dag rows in opposite orders: one is the deadlock
    victim, is retried from BEGIN, and the end state has each event exactly once.

    With ``inside_savepoint`` the second lock is taken inside a SAVEPOINT: on
    MariaDB/MySQL the victim then sees error 1305 (SAVEPOINT does not exist)
    with the 1213 deadlock only further down the exception chain.
    """
    with Session(engine) as session:
        add_dags(session, ["x", "y", "consumer"])
        ids = {name: add_asset(session, name) for name in ("a", "b")}
        for asset_id in ids.values():
            schedule_on_asset(session, asset_id, ["consumer"])
        session.commit()

    barrier = threading.Barrier(2, timeout=30)
    attempts = {"a": 0, "b": 0}
    retries = []
    seen = []
    add_listener(seen.append)
    errors = []

    def producer(name, first, second):
        def work(session, sink):
            attempts[name] += 1
            register_asset_change(asset=asset_ref(name), session=session, callback_sink=sink)
            _touch(session, first)
            if attempts[name] == 1:
                barrier.wait()  # both hold their first lock before taking the second
            if inside_savepoint:
                with session.begin_nested():
                    _touch(session, second)
            else:
                _touch(session, second)

        try:
            run_in_transaction(
                sessionmaker(engine),
                work,
                initial_wait=0.05,
                on_retry=lambda n, found: retries.append((name, found)),
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=producer, args=("a", "x", "y")),
        threading.Thread(target=producer, args=("b", "y", "x")),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        remove_listener(seen.append)
    assert not errors, errors
    assert [found.kind for _, found in retries] == [RetryableKind.DEADLOCK], retries
    assert sorted(attempts.values()) == [1, 2]
    # Exactly once each, although one transaction ran twice.
    assert sorted(e.asset_id for e in events(engine)) == sorted(ids.values())
    assert queued(engine) == {(ids["a"], "consumer"), (ids["b"], "consumer")}
    assert sorted(info.asset_name for info in seen) == ["a", "b"]


@pytest.mark.backends("sqlite")
def test_sqlite_busy_is_retried(backend, db_url):
    holder = create_engine(db_url)
    waiter = create_engine(db_url)

    @sa.event.listens_for(waiter, "connect")
    def short_busy_timeout(dbapi_connection, _record):  # runs after ours: override 30 s
        dbapi_connection.execute("PRAGMA busy_timeout=50")

    with Session(holder) as session:
        add_dags(session, ["c"])
        asset_id = add_asset(session, "a")
        schedule_on_asset(session, asset_id, ["c"])
        session.commit()

    conn = holder.connect()
    conn.begin()  # BEGIN IMMEDIATE: holds the write lock
    released = threading.Timer(0.5, lambda: (conn.commit(), conn.close()))
    released.start()
    retries = []
    try:
        run_in_transaction(
            sessionmaker(waiter),
            lambda s, sink: register_asset_change(asset=asset_ref("a"), session=s),
            initial_wait=0.2,
            max_attempts=10,
            on_retry=lambda n, found: retries.append(found),
        )
    finally:
        released.join()
    assert retries and {r.kind for r in retries} == {RetryableKind.BUSY}
    assert queued(waiter) == {(asset_id, "c")}
    assert len(events(waiter)) == 1
    holder.dispose()
    waiter.dispose()


@pytest.mark.backends("sqlite")  # a held write lock is the simplest retryable error to provoke
def test_retries_are_bounded_and_callbacks_dropped(backend, db_url):
    sent = Recorded()
    holder = create_engine(db_url)
    waiter = create_engine(db_url)

    @sa.event.listens_for(waiter, "connect")
    def short_busy_timeout(dbapi_connection, _record):
        dbapi_connection.execute("PRAGMA busy_timeout=10")

    ran = []
    with holder.connect() as conn:
        conn.begin()
        started = time.monotonic()
        with pytest.raises(RetriesExhaustedError) as caught:
            run_in_transaction(
                sessionmaker(waiter),
                lambda s, sink: (s.execute(sa.select(1)), sink.append(lambda: ran.append(1))),
                max_attempts=3,
                initial_wait=0.01,
                max_wait=0.02,
                metrics=sent,
            )
        conn.rollback()
    assert time.monotonic() - started < 5
    assert classify(caught.value).kind is RetryableKind.BUSY
    assert ran == []
    assert sent.sent == [("incr", "transaction_retries", 1)] * 2  # three attempts, two retries
    holder.dispose()
    waiter.dispose()


def test_non_retryable_errors_propagate_unchanged(engine):
    calls = []

    def work(session, sink):
        calls.append(1)
        sink.append(lambda: calls.append("callback"))
        session.execute(sa.text("SELECT * FROM no_such_table"))

    with pytest.raises(sa.exc.DBAPIError) as caught:
        run_in_transaction(sessionmaker(engine), work)
    assert classify(caught.value) is None
    assert calls == [1]
