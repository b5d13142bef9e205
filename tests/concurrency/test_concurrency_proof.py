"""The deadlock proof, small enough for the default suite (PostgreSQL and MariaDB/MySQL).

Every test runs concurrent producer transactions (threads with their own
connections, in waves on an emptied queue, see ``concurrency_harness``) and
checks, after every wave, that the queue holds exactly the rows the committed
transactions emitted. The set-based strategies must show no deadlock; the same
harness must catch the deadlocks of an unsorted loop, of per-call statements
in multi-outlet transactions, and of rows inserted in reversed order, so a
harness that could not see a deadlock fails here instead of passing vacuously.

``airflow-adrq bench`` runs the same transactions at benchmark sizes, in
separate processes.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_adrq import dialects
from airflow_adrq.manager import build_queue_statement
from airflow_adrq.models import AssetDagRunQueue, DagModel, DagScheduleAssetReference, UtcDateTime, utcnow
from airflow_adrq_testing import dataset
from tests.concurrency.concurrency_harness import run_producers, run_waves, seeded_engine

pytestmark = [pytest.mark.backends("postgresql", "mysql"), pytest.mark.slow]


@pytest.mark.parametrize(
    ("strategy", "scenario"),
    [
        # One asset per transaction: one ordered statement per call suffices.
        ("per_call", "single"),
        # Three assets per transaction in random order: only one statement per
        # transaction (at commit) keeps a single global lock order.
        ("commit_time", "multi_outlet"),
    ],
)
def test_set_based_strategies_never_deadlock(backend, db_url, strategy, scenario):
    outcome = run_producers(db_url, strategy, scenario, producers=6, waves=8)

    assert outcome.failure_counts == {}, outcome.failure_counts
    assert outcome.committed == 48
    assert outcome.rows_exact, outcome.checks


@pytest.mark.parametrize(
    ("strategy", "scenario"),
    [
        # Airflow 3.3.2's loop, rows in set order: deadlocks where per_call does not.
        ("airflow_3_3", "single"),
        # Ordered per call, but several assets per transaction: deadlocks where
        # commit_time does not.
        ("per_call", "multi_outlet"),
    ],
)
def test_same_harness_catches_deadlocks(backend, db_url, strategy, scenario):
    outcome = run_producers(db_url, strategy, scenario, producers=6, waves=30, stop_on_deadlock=True)

    assert outcome.deadlocks > 0, f"no deadlock in {len(outcome.results)} transactions"
    assert outcome.rows_exact, outcome.checks


def _direct_refs_statement(bind, asset_id, *, descending):
    """airflow_adrq.queue's statement shape (direct references only), in either order."""
    ref = DagScheduleAssetReference.__table__
    dag = DagModel.__table__
    adrq = AssetDagRunQueue.__table__
    rows = (
        sa.select(ref.c.asset_id, ref.c.dag_id, sa.bindparam("created_at", utcnow(), type_=UtcDateTime()))
        .join(dag, dag.c.dag_id == ref.c.dag_id)
        .where(ref.c.asset_id == asset_id, dag.c.is_paused == sa.false())
        .order_by(ref.c.asset_id, ref.c.dag_id.desc() if descending else ref.c.dag_id)
    )
    columns = [adrq.c.asset_id, adrq.c.target_dag_id, adrq.c.created_at]
    return dialects.get(bind).insert_from_select(
        adrq, columns, rows, ("asset_id", "target_dag_id"), "ignore", "created_at"
    )


@pytest.mark.parametrize("reverse_one", [False, True], ids=["same-order", "one-reversed"])
def test_rows_are_locked_in_order_by_order(backend, db_url, reverse_one):
    """Pins the undocumented fact the design relies on: ``INSERT ... SELECT ...
    ORDER BY`` inserts, and so locks, rows in ORDER BY order.

    Two producers queue the same 512 rows at the same moment, wave after wave:
    the library's statement on one side, the same statement ordered one way or
    the other on the other side. Reversed, they must deadlock; same order, they
    must not. If a server inserted in some other order (say, physical order),
    the reversed pair would stop deadlocking and this test would fail.
    """
    eng = seeded_engine(db_url, fanout=512, outlets=1, threads=2)
    try:
        with eng.connect() as conn:
            (asset_id,) = dataset.main_asset_ids(conn)
            consumers = dataset.consumer_dags(conn, [asset_id])[asset_id]

        # Both statements are built before the wave starts, so neither thread
        # is still in Python while the other's statement runs.
        library_statement = build_queue_statement(eng.dialect, source="assets")
        params = {"ids": [asset_id], "created_at": utcnow()}
        other_statement = _direct_refs_statement(eng, asset_id, descending=reverse_one)

        def library(_rng):
            return [asset_id], lambda session: session.execute(library_statement, params)

        def hand_built(_rng):
            return [asset_id], lambda session: session.execute(other_statement)

        def expected(results):
            return {(asset_id, d) for d in consumers} if any(r.ok for r in results) else set()

        # Reversed, it stops at the first deadlock; up to 90 waves, since under a
        # loaded machine (xdist's other worker) the two statements overlap less often.
        waves = 90 if reverse_one else 30
        outcome = run_waves(
            eng, [library, hand_built], waves=waves, expected=expected, stop_on_deadlock=reverse_one
        )
    finally:
        eng.dispose()

    if reverse_one:
        assert outcome.deadlocks > 0, f"reversed order did not deadlock in {len(outcome.checks)} waves"
    else:
        assert outcome.failure_counts == {}
        assert outcome.committed == 60
    assert outcome.rows_exact, outcome.checks
