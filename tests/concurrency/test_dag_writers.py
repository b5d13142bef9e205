"""The consumers' ``dag`` share locks against Airflow's other writers of ``dag``: no deadlock, either order.

Airflow 3.3.2's writers that wait for ``dag`` rows (the scheduler's
``dags_needing_dagruns`` skips locked rows and never waits):

* the DAG processor, once per parsed file: ``find_orm_dags`` locks the
  file's DAGs with ``SELECT ... FOR NO KEY UPDATE OF dag`` (MySQL ``FOR
  UPDATE``) in plan order (no ``ORDER BY``), then flushes its changes;
* pausing and unpausing (REST ``PATCH /dags``: ``UPDATE dag SET is_paused
  ... WHERE dag_id IN (...)``), deactivation (``UPDATE dag SET is_stale``),
  and the scheduler's own ``exceeds_max_non_backfill`` flushes.

Each locks its rows one by one, in an order of its own (the index's
collation, the heap's, Python's). A writer is modelled as one statement per
row, in the order given, so the interleaving can be forced: the writer takes
its first row, a producer starts and waits for it (polled on the server's
lock tables), the writer takes its second row, commits. A producer that
waits while it holds a share lock on the writer's second row deadlocks
(the control: the share locks taken in ``COLLATE "C"`` order, blocking).
airflow-adrq's producer never waits while holding one on PostgreSQL
(``NOWAIT`` under a SAVEPOINT, then a wait for the busy row alone), so both
orders pass. On MySQL/MariaDB (where ROLLBACK TO SAVEPOINT keeps InnoDB's
row locks) it takes them blocking, in the primary key's order, which is the
order InnoDB's range scans of Airflow's ``IN`` lists lock them in: the
writer in that order passes; the reverse is shown to deadlock.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine
from airflow_adrq.models import DagModel
from tests.concurrency.test_dag_share_lock import HeldCommit
from tests.factories import add_asset, add_dags, queued, schedule_on_asset
from tests.support.dag_writers import SENT, blocking_control, deadlocked, find_orm_dags, ours
from tests.support.locks import backend_id, blocked_by

_DAG = DagModel.__table__
#: Byte order puts "B" before "a"; en_US and most collations put it after.
DAGS = ["B", "a"]


def _update(column: str, value: object):
    def write(conn: sa.Connection, dag_id: str) -> None:
        conn.execute(sa.update(_DAG).where(_DAG.c.dag_id == dag_id).values({column: value}))

    return write


WRITERS = {
    "dag processor (find_orm_dags)": find_orm_dags,
    "pause through the REST API": _update("is_paused", False),
    "deactivation": _update("is_stale", False),
    "scheduler (exceeds_max_non_backfill)": _update("exceeds_max_non_backfill", False),
}


@pytest.fixture
def world(db_url):
    engine = create_engine(db_url, pool_size=6)
    with Session(engine) as s:
        add_dags(s, DAGS)
        asset_id = add_asset(s, "x")
        schedule_on_asset(s, asset_id, DAGS)
        s.commit()
    yield engine, asset_id
    engine.dispose()


_control = blocking_control(DAGS)


def _writer_first(engine: sa.Engine, producer, writer, order: list[str]) -> tuple[bool, bool]:
    """Writer takes ``order[0]``, the producer starts and waits, writer takes ``order[1]`` and commits.

    Returns (producer deadlocked, writer deadlocked).
    """
    errors: list[BaseException] = []
    waiter: list[object] = []

    def produce() -> None:
        try:
            with Session(engine) as s:
                waiter.append(backend_id(s.connection()))
                producer(s)
        except BaseException as exc:
            errors.append(exc)

    writer_error: BaseException | None = None
    with engine.connect() as conn:
        conn.begin()
        writer(conn, order[0])
        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        assert blocked_by(engine, waiter, backend_id(conn), thread.is_alive), (
            f"the producer did not wait: {errors}"
        )
        try:
            writer(conn, order[1])
            conn.commit()
        except sa.exc.DBAPIError as exc:
            writer_error = exc
            conn.rollback()
    thread.join(30)
    assert not thread.is_alive()
    producer_error = errors[0] if errors else None
    for error in (producer_error, writer_error):
        if error is not None and not deadlocked(error):
            raise error
    return deadlocked(producer_error), deadlocked(writer_error)


def _producer_first(engine: sa.Engine, writer) -> None:
    """The producer holds its share locks (its COMMIT held); the writer waits for it, then goes on."""
    held = HeldCommit(engine)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with Session(engine) as s:
                ours(s)
        except BaseException as exc:
            errors.append(exc)

    held.thread = threading.Thread(target=produce, daemon=True)
    held.thread.start()
    assert held.reached.wait(20), errors
    done: list[BaseException | None] = []
    waiter: list[object] = []

    def write() -> None:
        try:
            with engine.begin() as conn:
                waiter.append(backend_id(conn))
                for dag_id in DAGS:
                    writer(conn, dag_id)
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    assert blocked_by(engine, waiter, held.backend, thread.is_alive), f"the writer did not wait: {done}"
    held.release.set()
    held.thread.join(20)
    thread.join(20)
    assert not errors and done == [None], (errors, done)


@pytest.mark.backends("postgresql")
@pytest.mark.parametrize("writer", WRITERS, ids=list(WRITERS))
def test_postgresql_no_deadlock_in_either_order_the_blocking_control_deadlocks(world, writer):
    engine, asset_id = world
    write = WRITERS[writer]
    SENT.sent.clear()
    # The control waits holding "B" for "a": the writer, holding "a", then wants "B".
    assert _writer_first(engine, _control, write, ["a", "B"]) != (False, False)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM asset_dag_run_queue")
    for order in (["a", "B"], ["B", "a"]):
        assert _writer_first(engine, ours, write, order) == (False, False), order
        assert queued(engine) == {(asset_id, "B"), (asset_id, "a")}
    # Each time ours met the writer's row (NOWAIT), the operator's counter says so.
    assert SENT.sent.count(("incr", "queue_write.lock_waits", 1)) >= 2
    _producer_first(engine, write)
    assert queued(engine) == {(asset_id, "B"), (asset_id, "a")}


@pytest.mark.backends("mysql")
@pytest.mark.parametrize("writer", WRITERS, ids=list(WRITERS))
def test_mysql_no_deadlock_in_primary_key_order(world, writer):
    engine, asset_id = world
    write = WRITERS[writer]
    assert _writer_first(engine, ours, write, ["B", "a"]) == (False, False)  # utf8mb3_bin: "B" < "a"
    assert queued(engine) == {(asset_id, "B"), (asset_id, "a")}
    _producer_first(engine, write)
    # The reverse order is what it does not survive (InnoDB keeps a savepoint's row locks).
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM asset_dag_run_queue")
    assert _writer_first(engine, ours, write, ["a", "B"]) != (False, False)
