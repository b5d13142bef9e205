"""Producers of *different* assets feeding one DAG, ordered against the scheduler by the ``dag`` row lock.

The interleaving, forced step by step (a producer is held between its queue
write and its COMMIT by a hook on the engine's ``commit`` event, not by a
sleep):

1. P0 (asset a1) commits: the queue row (a1, d) exists.
2. P1 (a1) writes the queue and is stamped t1, and does not commit yet.
3. P2 (a3, another asset, another row) is stamped t2 > t1 and commits.
4. A scheduler pass: Airflow 3.3.2's ``dags_needing_dagruns`` lock on the
   ``dag`` row (``FOR NO KEY UPDATE SKIP LOCKED``; MySQL 8 ``FOR UPDATE
   SKIP LOCKED``, which MariaDB's ``SKIP LOCKED`` stands in for here), then
   ``_create_dag_runs_asset_triggered`` (:func:`scheduler_pass`).
5. P1 commits; P3 (a1) moves (a1, d) past t2; two more scheduler passes.

With the landed protocol (rows written with a placeholder, then stamped, no
``dag`` lock) step 4 takes (a3, d) and skips (a1, d), which P1 holds: a run
at t2 over the committed events, without P1's invisible one; the next run's
window starts after t2, and P1's event (t1) is consumed by no run. With the
share lock, step 4 skips the DAG: P1 holds its ``dag`` row ``FOR SHARE``
from before its stamp until its COMMIT, and every event reaches exactly one
run.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, register_asset_change
from airflow_adrq.models import AssetDagRunQueue, AssetEvent
from airflow_adrq_testing.protocols import landed
from airflow_adrq_testing.scheduler import scheduler_pass
from tests.factories import add_asset, add_dags, asset_ref, schedule_on_asset

DAG = "d"
_ADRQ = AssetDagRunQueue.__table__
_EVENT = AssetEvent.__table__


def _landed(session: Session, name: str) -> None:
    """The protocol before the ``dag`` lock: rows at PENDING, then the database's clock on rows and event."""
    asset_id = session.connection().execute(sa.text("SELECT id FROM asset WHERE name = :n"), {"n": name})
    landed(session, [asset_id.scalar_one()])


def _ours(session: Session, name: str) -> None:
    # "refresh": what on_conflict="auto" resolves to where the scheduler locks
    # rows (PostgreSQL, MySQL 8); MariaDB's own auto is refresh_after_commit.
    register_asset_change(asset=asset_ref(name), session=session, on_conflict="refresh")
    session.commit()


PROTOCOLS = {"landed": _landed, "ours": _ours}


class HeldCommit:
    """Holds one thread's COMMIT: the ``commit`` event fires just before the DBAPI commit."""

    def __init__(self, engine: sa.Engine) -> None:
        self.thread: threading.Thread | None = None
        self.reached = threading.Event()
        self.release = threading.Event()
        self.backend: object = None
        sa.event.listen(engine, "commit", self._hook)

    def _hook(self, conn: sa.Connection) -> None:
        if threading.current_thread() is self.thread:
            #: The held session's server-side id (pg_backend_pid / CONNECTION_ID).
            query = (
                "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
            )
            self.backend = conn.exec_driver_sql(query).scalar_one()
            self.reached.set()
            assert self.release.wait(30), "never released"


def _scenario(db_url: str, protocol: str) -> tuple[Counter, int]:
    """Runs the interleaving; returns how many runs consumed each event, and the runs."""
    engine = create_engine(db_url, pool_size=6)
    try:
        with Session(engine) as s:
            add_dags(s, [DAG])
            for name in ("a1", "a3"):
                schedule_on_asset(s, add_asset(s, name), [DAG])
            s.commit()
        write = PROTOCOLS[protocol]
        runs: list = []

        def schedule() -> None:
            with engine.begin() as conn:
                run = scheduler_pass(conn, DAG, locks=True, runs=runs)
            if run is not None:
                runs.append(run)

        with Session(engine) as s:
            write(s, "a1")  # P0
        held = HeldCommit(engine)
        errors: list[BaseException] = []

        def p1() -> None:
            try:
                with Session(engine) as s:
                    write(s, "a1")
            except BaseException as exc:
                errors.append(exc)

        held.thread = threading.Thread(target=p1, daemon=True)
        held.thread.start()
        assert held.reached.wait(20), f"P1 never reached its COMMIT: {errors}"
        with Session(engine) as s:
            write(s, "a3")  # P2: stamped after P1, committed first
        schedule()
        held.release.set()
        held.thread.join(20)
        assert not held.thread.is_alive() and not errors, errors
        with Session(engine) as s:
            write(s, "a1")  # P3
        schedule()
        schedule()
        with engine.connect() as conn:
            every = list(conn.execute(sa.select(_EVENT.c.id).order_by(_EVENT.c.id)).scalars())
        consumed = Counter(event_id for _, events in runs for event_id in events)
        return Counter({event_id: consumed[event_id] for event_id in every}), len(runs)
    finally:
        engine.dispose()


@pytest.mark.backends("postgresql", "mysql")
@pytest.mark.parametrize("protocol", ["landed", "ours"])
def test_an_event_of_another_asset_committed_first_is_not_lost(db_url, protocol):
    counts, runs = _scenario(db_url, protocol)
    assert len(counts) == 4  # P0, P1, P2, P3
    if protocol == "landed":
        # The harness catches the loss: P1's event (the second) reached no run.
        assert [counts[e] for e in sorted(counts)] == [1, 0, 1, 1], counts
        assert runs == 2
    else:
        assert set(counts.values()) == {1}, counts
        assert runs == 1  # the first pass skipped the DAG; one run took all four
