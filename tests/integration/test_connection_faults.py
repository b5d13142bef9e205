"""Connections killed by the server, at each point of a producer transaction.

Another connection terminates the producer's backend (``pg_terminate_backend``
/ ``KILL CONNECTION``):

* during the work, and inside the commit-time queue write: nothing was
  committed, so ``run_in_transaction`` runs the whole transaction again on a
  new connection, and the database ends with exactly one copy of it;
* just before the COMMIT reaches the server (SQLAlchemy's ``commit`` event,
  which fires right before the driver sends COMMIT): the outcome is unknown
  to the client, so it raises ``CommitOutcomeUnknownError`` and never retries.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from airflow_adrq import CommitOutcomeUnknownError, create_engine, register_asset_change, run_in_transaction
from airflow_adrq.retry import RetryableKind, commit_outcome
from tests.factories import add_asset, add_dags, asset_ref, events, queued, schedule_on_asset

pytestmark = pytest.mark.backends("postgresql", "mysql")

_OWN_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


class Killer:
    """Terminates a given server connection from a connection of its own, and waits for it to go."""

    def __init__(self, db_url, backend):
        self.backend = backend
        self.engine = sa.create_engine(db_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.kills = 0

    def kill(self, connection_id):
        with self.engine.connect() as conn:
            if self.backend == "postgresql":
                # PostgreSQL 14+: wait (up to 5 s) until the backend has exited.
                assert conn.scalar(sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": connection_id})
            else:
                conn.exec_driver_sql(f"KILL CONNECTION {int(connection_id)}")
        self.kills += 1

    def close(self):
        self.engine.dispose()


@pytest.fixture
def setup(backend, db_url, engine):
    with Session(engine) as s:
        add_dags(s, ["c1", "c2"])
        schedule_on_asset(s, add_asset(s, "a"), ["c1", "c2"])
        s.commit()
    killer = Killer(db_url, backend)
    yield engine, killer
    killer.close()


def _own_id(session, backend):
    return session.connection().exec_driver_sql(_OWN_ID[backend]).scalar()


def _run(engine, work, retries):
    return run_in_transaction(
        sessionmaker(engine),
        work,
        max_attempts=3,
        initial_wait=0.01,
        max_wait=0.05,
        on_retry=lambda n, found: retries.append(found.kind),
    )


def _assert_exactly_once(engine):
    asset_events = events(engine)
    assert len(asset_events) == 1, asset_events
    assert len(queued(engine)) == 2


def test_killed_during_work_is_retried_on_a_new_connection(backend, setup):
    engine, killer = setup
    retries, ran = [], []

    def work(session, sink):
        register_asset_change(asset=asset_ref("a"), session=session, callback_sink=sink)
        sink.append(lambda: ran.append(1))
        if killer.kills == 0:
            killer.kill(_own_id(session, backend))
            session.execute(sa.text("SELECT 1"))  # the next statement finds the connection gone

    _run(engine, work, retries)
    assert retries == [RetryableKind.CONNECTION_LOST]
    assert ran == [1]
    _assert_exactly_once(engine)


def test_killed_inside_the_commit_time_queue_write_is_retried(backend, setup):
    engine, killer = setup
    retries = []

    def kill_before_queue_write(conn, cursor, statement, parameters, context, executemany):
        if "INSERT INTO asset_dag_run_queue" in statement and killer.kills == 0:
            killer.kill(conn.exec_driver_sql(_OWN_ID[backend]).scalar())

    sa.event.listen(engine, "before_cursor_execute", kill_before_queue_write)
    try:
        _run(engine, lambda s, sink: register_asset_change(asset=asset_ref("a"), session=s), retries)
    finally:
        sa.event.remove(engine, "before_cursor_execute", kill_before_queue_write)
    assert retries == [RetryableKind.CONNECTION_LOST]
    _assert_exactly_once(engine)


def test_killed_while_commit_is_in_flight_is_not_retried(backend, setup):
    engine, killer = setup
    retries, attempts, ran = [], [], []
    own = {}

    def work(session, sink):
        attempts.append(1)
        own["id"] = _own_id(session, backend)
        register_asset_change(asset=asset_ref("a"), session=session, callback_sink=sink)
        sink.append(lambda: ran.append(1))

    def kill_on_commit(conn):
        # SQLAlchemy emits this right before the driver sends COMMIT.
        killer.kill(own["id"])

    sa.event.listen(engine, "commit", kill_on_commit)
    try:
        with pytest.raises(CommitOutcomeUnknownError) as caught:
            _run(engine, work, retries)
    finally:
        sa.event.remove(engine, "commit", kill_on_commit)
    assert isinstance(caught.value.__cause__, sa.exc.DBAPIError)
    assert attempts == [1] and retries == [] and ran == []
    # Here the server died before the COMMIT arrived, so nothing was committed;
    # the client could not know that, which is why it did not retry. The error
    # names the events to look for, and commit_outcome finds none of them.
    assert events(engine) == [] and queued(engine) == set()
    assert len(caught.value.event_ids) == 1
    assert commit_outcome(sessionmaker(engine), caught.value) is False


def test_a_pooled_connection_killed_while_idle_is_replaced(backend, db_url, setup):
    """The first statement finds the pooled connection dead; the retry gets a new one."""
    engine, killer = setup
    eng = create_engine(db_url, pool_size=1, max_overflow=0)
    try:
        with eng.connect() as conn:
            idle_id = conn.exec_driver_sql(_OWN_ID[backend]).scalar()
        killer.kill(idle_id)  # now idle in the pool
        retries = []
        _run(eng, lambda s, sink: register_asset_change(asset=asset_ref("a"), session=s), retries)
        assert retries == [RetryableKind.CONNECTION_LOST]
    finally:
        eng.dispose()
    _assert_exactly_once(engine)


def test_commit_outcome_finds_a_committed_transaction(setup):
    engine, _killer = setup
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), session=session)
        session.commit()
        error = CommitOutcomeUnknownError("pretend the COMMIT's answer was lost")
        error.event_ids = (event.id,)
    assert commit_outcome(sessionmaker(engine), error) is True
    assert commit_outcome(sessionmaker(engine), CommitOutcomeUnknownError()) is None
