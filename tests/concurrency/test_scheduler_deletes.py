"""Producers against Airflow 3.3's scheduler deleting the queue rows it consumed.

The scheduler (``_create_dag_runs_asset_triggered``) goes through the DAGs
that have queue rows in Python-set order, all in one transaction: per DAG it
selects the DAG's rows -- ``FOR UPDATE SKIP LOCKED`` where Airflow uses row
locks (PostgreSQL, MySQL 8), plainly where it does not (MariaDB,
``with_row_locks`` is a no-op there) -- creates the run, and deletes exactly
those rows. This harness does the same with 16 consumer DAGs, pass after
pass, while 4 producers commit events of their asset.

* A scheduler that locks first never waits for a producer (the DAG's ``dag``
  row, then its queue rows, SKIP LOCKED, then deletes only rows it holds, as
  Airflow's ``dags_needing_dagruns`` and ``_create_dag_runs_asset_triggered``
  do); a producer refreshing a locked row waits for the scheduler's COMMIT
  and inserts a fresh row. Without the ``dag`` row step, a producer's new row
  could meet the scheduler's DELETE scanning the ``target_dag_id`` index on
  InnoDB (seen once in a full suite run): the real scheduler never deletes a
  DAG's rows while a producer holds that DAG's ``dag`` row ``FOR SHARE``. So ``"refresh"`` cannot
  deadlock with it: 0 deadlocks, on PostgreSQL and on InnoDB (MariaDB's
  SKIP LOCKED stands in for MySQL 8's).
* A scheduler that does not lock deletes DAG by DAG in random order while a
  refresh locks existing rows in key order: they deadlock, in this harness
  hundreds of times in a few seconds, which is why ``"auto"`` is
  ``"refresh_after_commit"`` on MariaDB: the producer's statement skips
  existing rows with a lock-free ``NOT EXISTS`` (``"ignore"``), and the
  refresh moves forwards only the rows no one holds (``SKIP LOCKED``), the
  held ones after COMMIT (:mod:`airflow_adrq.refresh`). What remains is the race on a row deleted
  and re-inserted at the same moment (an insert's duplicate check waits on
  the row the scheduler deleted but has not committed, while the scheduler's
  DELETE waits on a row the producer just inserted), a small fraction of the
  no-op ``ON DUPLICATE KEY UPDATE`` shape's. The counts are one harness run;
  the tests compare shapes side by side, per committed transaction, not
  against a fixed rate.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, dialects, register_asset_change
from airflow_adrq.models import AssetDagRunQueue, DagModel, utcnow
from airflow_adrq.retry import RetryableKind, classify
from tests.factories import add_asset, add_dags, asset_ref, schedule_on_asset

pytestmark = pytest.mark.slow

DAGS = [f"dag_{i:02d}" for i in range(16)]
SECONDS = 5.0


def _old_shape(session, asset_id):
    # The MySQL shape before the NOT EXISTS probe: no-op ODKU on existing rows (locks them).
    session.execute(
        sa.text(
            "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) "
            "SELECT r.asset_id, r.dag_id, :now FROM dag_schedule_asset_reference r "
            "WHERE r.asset_id = :a ORDER BY r.asset_id, r.dag_id "
            "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id"
        ),
        {"a": asset_id, "now": utcnow().replace(tzinfo=None)},
    )


def _reset(engine):
    with engine.begin() as conn:
        for table in (
            "asset_dag_run_queue",
            "asset_event",
            "dag_schedule_asset_reference",
            "asset_active",
            "asset",
            "dag",
            "dag_bundle",
        ):
            conn.exec_driver_sql(f"DELETE FROM {table}")


def _run(db_url, producer, *, scheduler_locks):
    """Deadlocks per side and producer commits in SECONDS; ``producer``: an on_conflict mode or "old"."""
    engine = create_engine(db_url, pool_size=6)
    if engine.dialect.name == "postgresql":
        # Detect deadlocks after 50 ms instead of 1 s, so that a few seconds
        # show them (the test servers' user is a superuser).
        @sa.event.listens_for(engine, "connect")
        def _fast_detection(dbapi_connection, _record):
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET deadlock_timeout = '50ms'")

    with Session(engine) as s:
        add_dags(s, DAGS)
        asset_id = add_asset(s, "a")
        schedule_on_asset(s, asset_id, DAGS)
        s.commit()
    deadlocks = {"producer": 0, "scheduler": 0}
    committed = [0]
    lock = threading.Lock()
    stop = time.monotonic() + SECONDS
    adrq = AssetDagRunQueue.__table__
    dag_table = DagModel.__table__

    def count(who, exc):
        found = classify(exc)
        if found is None or found.kind is not RetryableKind.DEADLOCK:
            raise exc
        with lock:
            deadlocks[who] += 1

    def produce():
        while time.monotonic() < stop:
            try:
                with Session(engine) as session:
                    if producer == "old":
                        _old_shape(session, asset_id)
                    else:
                        register_asset_change(asset=asset_ref("a"), session=session, on_conflict=producer)
                    time.sleep(0.005)
                    session.commit()
                with lock:
                    committed[0] += 1
            except sa.exc.DBAPIError as exc:
                count("producer", exc)

    def schedule():
        rng = random.Random(1)
        while time.monotonic() < stop:
            order = list(DAGS)
            rng.shuffle(order)  # Python-set order
            try:
                with engine.begin() as conn:
                    for dag in order:
                        # Airflow's dags_needing_dagruns takes the DAG's dag row first
                        # (FOR NO KEY UPDATE / MySQL 8 FOR UPDATE, SKIP LOCKED): a DAG
                        # whose row a producer share-locks is skipped this pass.
                        if (
                            scheduler_locks
                            and conn.execute(
                                sa.select(dag_table.c.dag_id)
                                .where(dag_table.c.dag_id == dag)
                                .with_for_update(skip_locked=True, key_share=True)
                            ).first()
                            is None
                        ):
                            continue
                        query = sa.select(adrq.c.asset_id).where(adrq.c.target_dag_id == dag)
                        if scheduler_locks:
                            query = query.with_for_update(skip_locked=True)
                        rows = conn.execute(query).all()
                        if rows:
                            conn.execute(
                                sa.delete(adrq).where(
                                    adrq.c.target_dag_id == dag, adrq.c.asset_id.in_([r[0] for r in rows])
                                )
                            )
            except sa.exc.DBAPIError as exc:
                count("scheduler", exc)

    threads = [threading.Thread(target=produce) for _ in range(4)] + [threading.Thread(target=schedule)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    _reset(create_engine(db_url))
    return deadlocks, committed[0]


@pytest.mark.backends("mysql")
def test_unlocking_scheduler_ignore_and_the_default_deadlock_a_fraction_as_often(db_url, caplog):
    """MariaDB's scheduler: the no-op ODKU shape and an in-statement refresh deadlock with it.

    The statement's "ignore" (what "auto" = "refresh_after_commit" runs in the
    producer's transaction) has a small fraction of their deadlocks, per
    committed transaction; the default's refresh, which skips locked rows,
    adds almost none (its failures after COMMIT are logged, never raised:
    InnoDB once chose its ``SKIP LOCKED`` read as a deadlock victim, one
    failure in about 500 commits on a loaded machine; at most 1 % may fail).
    """
    with create_engine(db_url).connect() as conn:
        assert dialects.resolve("auto", conn) == "refresh_after_commit"
    old, old_committed = _run(db_url, "old", scheduler_locks=False)
    refresh, refresh_committed = _run(db_url, "refresh", scheduler_locks=False)
    ignore, ignore_committed = _run(db_url, "ignore", scheduler_locks=False)
    with caplog.at_level(logging.WARNING, logger="airflow_adrq.refresh"):
        after, after_committed = _run(db_url, "refresh_after_commit", scheduler_locks=False)
    print(
        f"unlocked scheduler: old {old} ({old_committed} commits), refresh {refresh} ({refresh_committed} "
        f"commits), ignore {ignore} ({ignore_committed} commits), default {after} ({after_committed} commits)"
    )
    # The harness catches the locking shapes' deadlocks...
    assert sum(old.values()) > 20, old
    assert sum(refresh.values()) > 20, refresh

    def per_commit(deadlocks: dict[str, int], committed: int) -> float:
        # Per committed transaction: on a loaded machine every shape commits less and deadlocks less.
        return sum(deadlocks.values()) / max(committed, 1)

    locking = min(per_commit(old, old_committed), per_commit(refresh, refresh_committed))
    # ...the statement's "ignore" has a small fraction of them, committing more...
    # (A factor 4, not the 8-15 measured: the counts are one 5 s run on a shared machine.)
    assert per_commit(ignore, ignore_committed) * 4 < locking, (ignore, old, refresh)
    assert ignore_committed > old_committed
    # ...and so has the default, whose refresh (never waiting) never failed after COMMIT. (A factor
    # 3: measured 4-5 against refresh and 10-15 against old, per commit, in four runs.)
    assert per_commit(after, after_committed) * 3 < locking, (after, old, refresh)
    assert after_committed > 20
    failed = [r for r in caplog.records if r.name == "airflow_adrq.refresh"]
    assert len(failed) <= after_committed // 100, [r.getMessage() for r in failed]


@pytest.mark.backends("postgresql", "mysql")
def test_refresh_never_deadlocks_with_a_scheduler_that_locks_first(db_url):
    """PostgreSQL and InnoDB with FOR UPDATE SKIP LOCKED (MySQL 8's scheduler): refresh waits, never cycles.

    The same harness with the scheduler's locks left out shows it catching
    refresh's deadlocks, so the 0 is not the harness missing them.
    """
    control, _ = _run(db_url, "refresh", scheduler_locks=False)
    ours, committed = _run(db_url, "refresh", scheduler_locks=True)
    print(f"refresh: unlocked scheduler {control}, SKIP LOCKED scheduler {ours} ({committed} commits)")
    assert sum(control.values()) > 5, control
    assert ours == {"producer": 0, "scheduler": 0}, ours
    assert committed > 20
