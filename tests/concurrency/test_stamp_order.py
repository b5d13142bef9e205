"""Which run consumes an event, when producers wait for each other's rows and two schedulers read.

Airflow 3.3's scheduler (``_create_dag_runs_asset_triggered``, copied step by
step in :func:`airflow_adrq_testing.scheduler.scheduler_pass`) takes a DAG's queue rows (``FOR UPDATE SKIP
LOCKED`` where it uses row locks), sets ``triggered_date`` to their newest
``created_at``, attaches the committed events with ``floor < timestamp <=
triggered_date`` (floor: the newest earlier run's ``run_after`` below
``triggered_date``), creates the run and deletes the rows it locked. A
producer stamped *before* it waited for a row lock can commit after a
later-stamped producer and after a scheduler read; the two interleavings
below are forced, step by step, with blocker transactions that hold a queue
row (an uncommitted INSERT of it) and a poll that waits until the producer
is waiting for it (``pg_locks``; ``information_schema.innodb_trx``):

* **Lost.** P1 (assets a1, a2) takes (a1, d), waits on (a2, d). P2 (a3)
  commits; the scheduler consumes up to P2's stamp without P1's invisible
  event; P1 commits; P3 refreshes (a1, d) with a later stamp; the next run's
  window starts after P2's stamp. Stamped before the wait, P1's event falls
  below it: consumed by no run.
* **Consumed twice.** P1 (a1, a2, a3) waits on (a1, d); Q (a2, a4) commits
  at T; P1 takes (a1, d) and (a2, d), waits on (a3, d). Scheduler 1 skips
  P1's rows, consumes up to T from (a4, d). P1 commits: stamped before its
  waits, it leaves ``greatest(T, t1) = T`` on (a2, d), so scheduler 2 makes a
  second run at T, whose floor excludes only runs *before* T: Q's events
  again.

Each scenario runs twice: with the old protocol (the stamp taken in Python,
then the statement, as the plug-in did before) it must lose or double an
event, which shows the harness catches it; with airflow-adrq's (lock, then
stamp from the database's clock, then COMMIT) every event must reach exactly
one run of the consumer. PostgreSQL and MariaDB; MariaDB's ``SKIP LOCKED``
stands in for MySQL 8's scheduler, and the lost case also runs with
MariaDB's own scheduler, which takes no row locks.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, register_asset_change
from airflow_adrq.models import AssetDagRunQueue, AssetEvent, utcnow
from airflow_adrq_testing.protocols import stamp_first
from airflow_adrq_testing.scheduler import scheduler_pass
from tests.factories import add_asset, add_dags, asset_ref, schedule_on_asset
from tests.support.locks import backend_id, blocked_by

DAG = "d"
ASSETS = ["a1", "a2", "a3", "a4"]
_ADRQ = AssetDagRunQueue.__table__
_EVENT = AssetEvent.__table__


# --- the two producer protocols ------------------------------------------------------


def _stamp_first(session: Session, names: list[str], assets: dict[str, int]) -> None:
    """The protocol before the fix: Python's clock on the events, then the one ordered statement, COMMIT."""
    stamp_first(session, [assets[name] for name in names])


def _ours(session: Session, names: list[str], _assets: dict[str, int]) -> None:
    for name in names:
        register_asset_change(asset=asset_ref(name), session=session)  # on_conflict="auto"
    session.commit()


PROTOCOLS = {"stamp_first": _stamp_first, "ours": _ours}


# --- the harness -----------------------------------------------------------------------


@dataclass
class World:
    engine: sa.Engine
    assets: dict[str, int]
    #: Committed runs of DAG: (run_after, consumed event ids), in creation order.
    runs: list[tuple[object, list[int]]] = field(default_factory=list)

    def blocker(self, name: str) -> sa.Connection:
        """An open transaction holding the (not yet committed) queue row (name, DAG)."""
        conn = self.engine.connect()
        conn.execute(
            sa.insert(_ADRQ).values(asset_id=self.assets[name], target_dag_id=DAG, created_at=utcnow())
        )
        return conn

    def produce(self, protocol, names, *, waits_on: sa.Connection | None = None) -> threading.Thread | None:
        """Run one producer transaction; with ``waits_on``, in a thread, returned once it waits for it."""

        def run():
            try:
                with Session(self.engine) as session:
                    if waits_on is not None:
                        started.append(backend_id(session.connection()))
                    PROTOCOLS[protocol](session, names, self.assets)
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        errors: list[BaseException] = []
        started: list[object] = []
        if waits_on is None:
            run()
            assert not errors, errors
            return None
        thread = threading.Thread(target=run, daemon=True)
        thread.errors = errors
        thread.waiter = started
        thread.start()
        deadline = time.monotonic() + 20
        while not started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        waiter = [started[0] if started else None]
        _wait_until_blocked(self.engine, waiter, backend_id(waits_on), thread)
        return thread

    def schedule(self, *, locks: bool) -> None:
        """One pass of Airflow 3.3.2's scheduler over DAG, committed."""
        with self.engine.begin() as conn:
            # On PostgreSQL the whole step, dag-row lock first: airflow-adrq's
            # producers hold it FOR SHARE from before their stamp (the
            # blockers' FK checks take only FOR KEY SHARE, which it does not
            # skip). On InnoDB the ADRQ step alone: the blockers' FK checks
            # share-lock the dag row, so the scheduler would skip the DAG
            # for every protocol and the harness would show nothing.
            lock_dag = conn.dialect.name == "postgresql"
            run = scheduler_pass(conn, DAG, locks=locks, runs=self.runs, lock_dag=lock_dag)
        if run is not None:
            self.runs.append(run)

    def reset(self) -> None:
        """Forget the runs, the events and the queue: the next scenario starts clean."""
        self.runs.clear()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(_ADRQ))
            conn.execute(sa.delete(_EVENT))

    def consumed(self) -> Counter:
        return Counter(event_id for _, events in self.runs for event_id in events)

    def all_events(self) -> list[int]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.select(_EVENT.c.id).order_by(_EVENT.c.id)).scalars())


def _wait_until_blocked(engine, waiter, blocker, thread=None) -> None:
    """Until connection ``waiter[0]`` waits for a lock that connection ``blocker`` holds."""
    if not blocked_by(engine, waiter, blocker, alive=lambda: thread is None or thread.is_alive()):
        if thread is not None and not thread.is_alive():
            raise AssertionError(f"the producer finished instead of waiting: {thread.errors}")
        raise AssertionError(f"the producer {waiter} never waited for blocker {blocker}")


def _release(blocker: sa.Connection) -> None:
    """Roll the blocker back: the producer waiting for its row goes on."""
    blocker.rollback()
    blocker.close()


def _join(thread: threading.Thread) -> None:
    thread.join(timeout=30)
    assert not thread.is_alive(), "the producer did not finish"
    assert not thread.errors, thread.errors


@pytest.fixture
def world(db_url):
    engine = create_engine(db_url, pool_size=8)
    with Session(engine) as s:
        add_dags(s, [DAG])
        assets = {name: add_asset(s, name) for name in ASSETS}  # ids in list order
        for asset_id in assets.values():
            schedule_on_asset(s, asset_id, [DAG])
        s.commit()
    yield World(engine, assets)
    with engine.begin() as conn:
        for table in ("asset_dag_run_queue", "asset_event", "dag_schedule_asset_reference", "asset_active"):
            conn.exec_driver_sql(f"DELETE FROM {table}")
        conn.exec_driver_sql("DELETE FROM asset")
        conn.exec_driver_sql("DELETE FROM dag")
        conn.exec_driver_sql("DELETE FROM dag_bundle")
    engine.dispose()


def _lost(world: World, protocol: str, *, locks: bool) -> Counter:
    """The first interleaving; returns how many runs consumed each event."""
    blocker = world.blocker("a2")
    p1 = world.produce(protocol, ["a1", "a2"], waits_on=blocker)  # holds (a1, d), waits on (a2, d)
    world.produce(protocol, ["a3"])  # P2: a later stamp, committed first
    world.schedule(locks=locks)  # consumes up to P2's stamp; P1's event is not visible yet
    _release(blocker)
    _join(p1)
    world.produce(protocol, ["a1"])  # P3 moves (a1, d) past P2's stamp
    world.schedule(locks=locks)
    world.schedule(locks=locks)  # nothing left
    return _counts(world)


def _twice(world: World, protocol: str) -> Counter:
    """The second interleaving, with two schedulers that lock (SKIP LOCKED)."""
    first, second = world.blocker("a1"), world.blocker("a3")
    p1 = world.produce(protocol, ["a1", "a2", "a3"], waits_on=first)  # waits on (a1, d)
    world.produce(protocol, ["a2", "a4"])  # Q at T
    _release(first)
    _wait_until_blocked(world.engine, p1.waiter, backend_id(second), p1)  # P1 now waits on (a3, d)
    world.schedule(locks=True)  # scheduler 1: skips P1's rows, consumes up to T
    _release(second)
    _join(p1)
    world.schedule(locks=True)  # scheduler 2
    world.schedule(locks=True)
    return _counts(world)


def _counts(world: World) -> Counter:
    consumed = world.consumed()
    return Counter({event_id: consumed[event_id] for event_id in world.all_events()})


def _check_lost(world: World, *, locks: bool) -> None:
    control = _lost(world, "stamp_first", locks=locks)
    # The harness catches the loss: P1's two events reached no run, the others one each.
    assert sorted(control.values()) == [0, 0, 1, 1], control
    world.reset()
    ours = _lost(world, "ours", locks=locks)
    assert len(ours) == 4 and set(ours.values()) == {1}, ours


@pytest.mark.backends("postgresql", "mysql")
def test_an_event_stamped_before_its_wait_is_lost_ours_is_consumed_once(world):
    """Airflow's scheduler with row locks (PostgreSQL, MySQL 8: MariaDB's SKIP LOCKED stands in)."""
    _check_lost(world, locks=True)


@pytest.mark.backends("mysql")
def test_the_same_with_a_scheduler_that_takes_no_row_locks(world):
    """MariaDB's Airflow scheduler (``with_row_locks`` is a no-op there)."""
    _check_lost(world, locks=False)


@pytest.mark.backends("postgresql", "mysql")
def test_a_row_left_at_another_runs_stamp_is_consumed_twice_ours_once(world):
    control = _twice(world, "stamp_first")
    # The harness catches it: Q's two events went to two runs with the same run_after.
    assert sorted(control.values()) == [1, 1, 1, 2, 2], control
    assert len({run_after for run_after, _ in world.runs}) < len(world.runs)
    world.reset()
    ours = _twice(world, "ours")
    assert len(ours) == 5 and set(ours.values()) == {1}, ours
    run_afters = [run_after for run_after, _ in world.runs]
    assert run_afters == sorted(set(run_afters))  # every run after the one before
