"""What the commit-time write promises beyond the rows: stamps, late deferrals, isolation."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import (
    AssetChange,
    DeferredTooLateError,
    IsolationLevelError,
    create_engine,
    dialects,
    register_asset_change,
    register_asset_changes,
)
from airflow_adrq.deferral import defer_events
from airflow_adrq.metrics import Recorded
from airflow_adrq.models import AssetDagRunQueue, AssetEvent
from airflow_adrq.shapes import UNPARTITIONED
from tests.factories import asset_ref, queued


def _stamps(engine):
    with engine.connect() as conn:
        events = dict(conn.execute(sa.select(AssetEvent.id, AssetEvent.timestamp)).all())
        adrq = AssetDagRunQueue.__table__
        rows = {
            (a, d): c
            for a, d, c in conn.execute(sa.select(adrq.c.asset_id, adrq.c.target_dag_id, adrq.c.created_at))
        }
    return events, rows


@pytest.mark.parametrize("queue_mode", ["commit", "immediate"])
def test_events_and_their_rows_are_stamped_together(engine, queue_mode, fan):
    ids = fan({"a": ["c1", "c2"], "b": ["c2", "c3"]})
    with Session(engine, expire_on_commit=False) as session:
        results = register_asset_changes(
            session=session,
            changes=[AssetChange(asset_ref("a")), AssetChange(asset_ref("b"))],
            queue_mode=queue_mode,
        )
        registered_at = [e.timestamp for e in results]
        session.commit()
    events, rows = _stamps(engine)
    (stamp,) = set(events.values())
    assert set(rows.values()) == {stamp}
    assert len(rows) == 4 and set(rows) == queued(engine)
    # The stamp is taken at the queue write, never before the registration.
    assert all(stamp >= t for t in registered_at)
    # The returned objects carry the stored stamp, without a reload.
    assert [e.timestamp for e in results] == [stamp, stamp]
    assert {ids["a"], ids["b"]} == {a for a, _ in rows}


def test_each_transaction_has_its_own_stamp(engine, fan):
    fan({"a": ["c1"]})
    with Session(engine) as session:
        for _ in range(2):
            register_asset_change(asset=asset_ref("a"), session=session)
            session.commit()
    events, rows = _stamps(engine)
    first, second = sorted(events.values())
    assert first < second
    # The queue row stands for the newest event ("auto" refreshes it: on
    # MariaDB after COMMIT).
    assert list(rows.values()) == [second]


def test_deferral_from_a_flush_hook_is_written(engine, fan):
    """An event registered by a before_flush hook during COMMIT's final flush is queued."""
    ids = fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        fired = []

        @sa.event.listens_for(session, "before_flush")
        def _hook(sess, _ctx, _instances):
            if not fired:
                fired.append(True)
                register_asset_change(asset=asset_ref("b"), session=sess)

        # Something for the final flush to do, as an ORM-using caller would have.
        session.add(AssetEvent(asset_id=ids["a"], extra={}))
        session.commit()
    assert queued(engine) == {(ids["a"], "c1"), (ids["b"], "c2")}


def test_deferral_after_the_commit_time_write_raises(engine, fan):
    """A before_commit listener registered after ours is too late to be written: a clear error, not a loss."""
    fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)  # installs our hooks first

        @sa.event.listens_for(session, "before_commit")
        def _late(sess):
            register_asset_change(asset=asset_ref("b"), session=sess)

        with pytest.raises(DeferredTooLateError, match="commit-time write"):
            session.commit()
        session.rollback()
    # The commit failed as a whole: no event and no queue row of either asset.
    assert queued(engine) == set()
    events, _ = _stamps(engine)
    assert events == {}


@pytest.mark.parametrize("on_conflict", ["refresh", "ignore", "auto"])
def test_the_rows_written_are_counted(engine, fan, on_conflict):
    """``queue_write.rows``: the queue rows the statement inserted or moved forwards, per commit."""
    sent = Recorded()
    fan({"a": ["c1", "c2"], "b": ["c2", "c3"]})
    for assets in (["a", "b"], ["a"]):
        with Session(engine) as session:
            for name in assets:
                register_asset_change(
                    asset=asset_ref(name), session=session, on_conflict=on_conflict, metrics=sent
                )
            session.commit()
    counted = sent.values("queue_write.rows")
    with engine.connect() as conn:
        mode = dialects.resolve(on_conflict, conn)
    # The second commit finds a's two rows: the statement moves them forwards only with
    # "refresh" (MySQL/MariaDB's affected rows count such a row twice); "refresh_after_commit"
    # (MariaDB's "auto") moves them after the statement, counted as refresh.rows.
    moved = {"refresh": 4 if engine.dialect.name == "mysql" else 2}.get(mode, 0)
    assert counted == [4, moved]
    refreshed = sent.values("refresh.rows")
    assert refreshed == ([2] if mode == "refresh_after_commit" else [])


def test_one_transaction_one_policy(engine, fan):
    """One statement queues the transaction: a second policy is refused at the call, not merged."""
    ids = fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, on_conflict="ignore")
        with pytest.raises(ValueError, match="already queues with 'ignore'"):
            register_asset_change(asset=asset_ref("b"), session=session, on_conflict="refresh")
        register_asset_change(asset=asset_ref("b"), session=session, on_conflict="ignore")
        session.commit()
    assert queued(engine) == {(ids["a"], "c1"), (ids["b"], "c2")}
    events, _ = _stamps(engine)
    assert len(events) == 2  # the refused call wrote nothing


def test_a_second_policy_after_a_rolled_back_savepoint_is_the_transaction_s(engine, fan):
    """The policy is held while events wait with it: once they are rolled back, another may start."""
    ids = fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        with session.begin_nested() as savepoint:
            register_asset_change(asset=asset_ref("a"), session=session, on_conflict="ignore")
            savepoint.rollback()
        register_asset_change(asset=asset_ref("b"), session=session, on_conflict="refresh")
        session.commit()
    assert queued(engine) == {(ids["b"], "c2")}


def test_one_transaction_one_shape(engine, fan):
    """The shape and schema are the statement's too: a second one is refused at the call."""
    fan({"a": ["c1"]})
    with Session(engine) as session:
        (event,) = register_asset_changes(session=session, changes=[AssetChange(asset_ref("a"))])
        with pytest.raises(ValueError, match="one transaction is queued by one statement"):
            defer_events(session, [event], shape=UNPARTITIONED)
        session.rollback()


def test_the_policy_in_force_is_logged_once(engine, fan, caplog):
    fan({"a": ["c1"]})
    dialects._log_in_force.cache_clear()  # once per process: this test needs the first time
    with caplog.at_level(logging.INFO, logger="airflow_adrq.dialects"):
        for _ in range(2):
            with Session(engine) as session:
                register_asset_change(asset=asset_ref("a"), session=session)
                session.commit()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "airflow_adrq.dialects"]
    assert line.startswith("airflow-adrq: on_conflict=auto is 'refresh"), line
    assert line.endswith(f" on {engine.dialect.name}"), line


@pytest.mark.backends("mysql")
def test_mysql_repeatable_read_is_refused_unless_allowed(db_url, engine, fan):
    fan({"a": ["c1"]})
    rr = create_engine(db_url, isolation_level="REPEATABLE READ")
    try:
        with Session(rr) as session:
            with pytest.raises(IsolationLevelError, match="REPEATABLE READ"):
                register_asset_change(asset=asset_ref("a"), session=session, queue_mode="immediate")
            session.rollback()
            register_asset_change(asset=asset_ref("a"), session=session)
            with pytest.raises(IsolationLevelError):
                session.commit()
            session.rollback()
        assert queued(engine) == set()

        allowed = rr.execution_options(adrq_allow_isolation=True)
        with Session(allowed) as session:
            register_asset_change(asset=asset_ref("a"), session=session)
            session.commit()
        assert len(queued(engine)) == 1
    finally:
        rr.dispose()


@pytest.mark.backends("mysql")
def test_mysql_isolation_is_read_per_connection_option(engine, fan):
    ids = fan({"a": ["c1"]})
    with engine.connect() as conn:
        rr = conn.execution_options(isolation_level="REPEATABLE READ")
        with Session(bind=rr) as session:
            with pytest.raises(IsolationLevelError):
                register_asset_change(asset=asset_ref("a"), session=session, queue_mode="immediate")
            session.rollback()
    # The same pooled connection, back at the engine's READ COMMITTED.
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, queue_mode="immediate")
        session.commit()
    assert queued(engine) == {(ids["a"], "c1")}


@pytest.mark.backends("postgresql", "mysql")  # SQLite: one writer, no delete can come in between
def test_a_consumer_deleted_before_the_commit_is_not_queued_and_the_others_are(engine, fan):
    ids = fan({"a": ["c1", "c2"]})
    with Session(engine) as s:
        register_asset_change(asset=asset_ref("a"), session=s)
        with engine.begin() as other:
            other.execute(sa.text("DELETE FROM dag WHERE dag_id = :d"), {"d": "c1"})
        s.commit()
    assert queued(engine) == {(ids["a"], "c2")}
