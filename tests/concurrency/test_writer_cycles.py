"""A cycle between two other writers of ``dag`` runs through a waiting producer: it must not fail it.

The shape PostgreSQL's log showed live (issue 36), forced step by step on
the server's lock tables (``tests.support.locks.blocked_by``), never by
sleeps:

1. the DAG processor (``find_orm_dags``: ``FOR NO KEY UPDATE``) holds
   consumer ``d1``;
2. a bulk ``PATCH /dags`` (``UPDATE dag SET is_paused ...``) holds ``d2``;
3. a producer of an asset feeding ``d1`` and ``d3`` finds ``d1`` busy and
   waits for it. It holds no ``dag`` row, but as the row's first waiter
   PostgreSQL makes it hold the row's *tuple lock*;
4. the bulk PATCH wants ``d1``: it queues behind the producer's tuple lock;
5. the DAG processor wants ``d2``: it waits for the PATCH. The cycle
   DAG processor -> PATCH -> producer -> DAG processor is closed.

The producer waited longest, so its ``deadlock_timeout`` fires first and it
is the victim. PostgreSQL checks for a cycle once per wait, when the timeout
fires, so each session's ``deadlock_timeout`` is set for that order: 5 s for
the producer (steps 3-5 take well under that, even on a loaded machine), 6 s
for the writers, who start waiting after it.
The control, a producer that waits for the row blocking (as a plain
``SELECT ... FOR SHARE`` does, and as airflow-adrq did), fails with 40P01.
airflow-adrq's producer goes back to its SAVEPOINT, dropping the tuple
lock, waits again, and commits with exactly its rows; the cycle is left to
the two writers, as it would be without it (one of them is the victim).

On MySQL/MariaDB every one of Airflow's writers locks an ``IN`` list in the
primary key's order (InnoDB's range scan), and so does the producer: with
the bulk PATCH in that order, no one waits in a cycle; with the PATCH in the
other order, the harness catches InnoDB's deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine
from airflow_adrq.errorcodes import classify
from airflow_adrq.models import DagModel
from tests.factories import add_asset, add_dags, queued, schedule_on_asset
from tests.support.dag_writers import SENT, blocking_control, deadlocked, find_orm_dags, ours
from tests.support.locks import backend_id, blocked_by

_DAG = DagModel.__table__
CONSUMERS = ["d1", "d3"]  # the producer's; d1 is the busy one
#: Each party's deadlock_timeout (PostgreSQL): the producer's fires first.
PRODUCER_TIMEOUT, WRITER_TIMEOUT = "5s", "6s"


@pytest.fixture
def world(db_url):
    engine = create_engine(db_url, pool_size=6)
    with Session(engine) as s:
        add_dags(s, ["d1", "d2", "d3"])
        asset_id = add_asset(s, "x")
        schedule_on_asset(s, asset_id, CONSUMERS)
        s.commit()
    yield engine, asset_id
    engine.dispose()


_control = blocking_control(CONSUMERS)


def _bulk_patch(conn: sa.Connection, dag_ids: list[str]) -> None:
    conn.execute(sa.update(_DAG).where(_DAG.c.dag_id.in_(dag_ids)).values(is_paused=False))


def _deadlock_timeout(conn: sa.Connection, value: str) -> None:
    conn.execute(sa.text("SELECT set_config('deadlock_timeout', :value, false)"), {"value": value})


class _Party:
    """One session in a thread of its own: ``run(conn)`` then COMMIT; what it raised, if anything."""

    def __init__(self, engine: sa.Engine, run: Callable[[sa.Connection], None]) -> None:
        self.engine, self.run = engine, run
        self.backend: list[object] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.run_in_session()
        except BaseException as exc:
            self.error = exc

    def run_in_session(self) -> None:
        with self.engine.connect() as conn:
            self.backend.append(backend_id(conn))
            self.run(conn)
            conn.commit()

    def join(self) -> BaseException | None:
        self.thread.join(30)
        assert not self.thread.is_alive(), "a party never ended"
        return self.error


class _Producer(_Party):
    def __init__(self, engine: sa.Engine, produce: Callable[[Session], None], timeout: str | None) -> None:
        self.produce, self.timeout = produce, timeout
        super().__init__(engine, lambda conn: None)

    def run_in_session(self) -> None:
        with Session(self.engine) as session:
            if self.timeout:
                _deadlock_timeout(session.connection(), self.timeout)
                session.commit()
            self.backend.append(backend_id(session.connection()))
            self.produce(session)


def _deadlocked(error: BaseException | None) -> bool:
    """:func:`deadlocked`; an error that is no database error at all is raised as it is."""
    if error is not None and classify(error) is None:
        raise error
    return deadlocked(error)


def _postgresql_cycle(engine: sa.Engine, produce: Callable[[Session], None]) -> tuple[bool, bool, bool]:
    """Steps 1-5 of the module docstring; (producer, DAG processor, PATCH) deadlocked."""
    with engine.connect() as processor, engine.connect() as patch:
        for conn in (processor, patch):
            _deadlock_timeout(conn, WRITER_TIMEOUT)
            conn.commit()
        patch_id = backend_id(patch)
        find_orm_dags(processor, "d1")  # 1.
        _bulk_patch(patch, ["d2"])  # 2.
        producer = _Producer(engine, produce, PRODUCER_TIMEOUT)  # 3.
        assert blocked_by(engine, producer.backend, backend_id(processor), producer.thread.is_alive)
        patch_error: list[BaseException] = []

        def patch_d1() -> None:  # 4., on the PATCH's own session
            try:
                _bulk_patch(patch, ["d1"])
                patch.commit()
            except sa.exc.DBAPIError as exc:
                patch_error.append(exc)
                patch.rollback()

        waiting_patch = threading.Thread(target=patch_d1, daemon=True)
        waiting_patch.start()
        assert blocked_by(engine, [patch_id], producer.backend[0], waiting_patch.is_alive)
        processor_error: BaseException | None = None
        try:  # 5.
            find_orm_dags(processor, "d2")
            processor.commit()
        except sa.exc.DBAPIError as exc:
            processor_error = exc
            processor.rollback()
        waiting_patch.join(30)
        assert not waiting_patch.is_alive()
    deadlocked = [producer.join(), processor_error, patch_error[0] if patch_error else None]
    return (_deadlocked(deadlocked[0]), _deadlocked(deadlocked[1]), _deadlocked(deadlocked[2]))


@pytest.mark.backends("postgresql")
def test_postgresql_producer_survives_a_cycle_between_the_dag_processor_and_a_bulk_patch(world):
    engine, asset_id = world
    SENT.sent.clear()
    # The control: queued on the row, it is the cycle's victim.
    producer, processor, patch = _postgresql_cycle(engine, _control)
    assert producer, "the control producer was not the victim: the interleaving was not forced"
    assert queued(engine) == set()
    # Ours: back to its SAVEPOINT, waits again, commits; the cycle is the two writers' own.
    SENT.sent.clear()
    producer, processor, patch = _postgresql_cycle(engine, ours)
    assert not producer
    assert processor or patch, "the writers' own cycle was not resolved by a deadlock"
    assert queued(engine) == {(asset_id, "d1"), (asset_id, "d3")}
    assert ("incr", "queue_write.wait_retries", 1) in SENT.sent


def _mysql_three_parties(engine: sa.Engine, patch_order: list[str]) -> list[BaseException]:
    """The DAG processor holds d1; the producer waits for it; the PATCH updates ``patch_order`` row by row."""
    with engine.connect() as processor:
        find_orm_dags(processor, "d1")
        producer = _Producer(engine, ours, None)
        assert blocked_by(engine, producer.backend, backend_id(processor), producer.thread.is_alive)

        def patch(conn: sa.Connection) -> None:
            for dag_id in patch_order:
                _bulk_patch(conn, [dag_id])

        writer = _Party(engine, patch)
        assert blocked_by(engine, writer.backend, backend_id(processor), writer.thread.is_alive)
        errors: list[BaseException] = []
        try:
            find_orm_dags(processor, "d2")
            processor.commit()
        except sa.exc.DBAPIError as exc:
            errors.append(exc)
            processor.rollback()
    errors += [e for e in (producer.join(), writer.join()) if e is not None]
    return errors


@pytest.mark.backends("mysql")
def test_mysql_no_cycle_with_every_writer_in_primary_key_order(world):
    engine, asset_id = world
    # InnoDB's range scan of Airflow's bulk UPDATE ... IN (d1, d2) locks d1 first.
    assert _mysql_three_parties(engine, ["d1", "d2"]) == []
    assert queued(engine) == {(asset_id, "d1"), (asset_id, "d3")}
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM asset_dag_run_queue")
    # The control: a PATCH holding d2 while it waits for d1 deadlocks with the DAG processor.
    errors = _mysql_three_parties(engine, ["d2", "d1"])
    assert any(_deadlocked(e) for e in errors), errors
