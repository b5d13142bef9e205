"""What Airflow 3.3.2's scheduler does to the queue, once for every consumer the tests and the benchmark run.

``_create_dag_runs_asset_triggered`` per DAG: take the DAG's queue rows
(``SELECT ... FROM asset_dag_run_queue WHERE target_dag_id = :dag ORDER BY
created_at DESC FOR UPDATE SKIP LOCKED``; SQLite has no row locks and ignores
the clause, BEGIN IMMEDIATE serialises instead; MariaDB's scheduler takes no
row locks, ``locks=False``), ``triggered_date`` = their newest ``created_at``,
the events of the DAG's assets with ``floor < timestamp <= triggered_date``
(floor: the newest earlier run's ``run_after`` below it), a run, and exactly
the rows taken deleted. The caller commits (Airflow commits once per
scheduler loop).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq.models import AssetDagRunQueue, AssetEvent, DagModel, DagScheduleAssetReference, UtcDateTime
from airflow_adrq_testing import dataset

ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)
EVENT = cast(sa.Table, AssetEvent.__table__)
REF = cast(sa.Table, DagScheduleAssetReference.__table__)
DAG = cast(sa.Table, DagModel.__table__)

#: The ``(run_after, consumed event ids)`` of one DAG run.
Run = tuple[dt.datetime, list[int]]


def queued(conn: sa.Connection, dag_id: str, *, locks: bool = True) -> list[tuple[int, dt.datetime]]:
    """The DAG's queue rows ``(asset_id, created_at)``, newest first, locked with ``locks``."""
    query = sa.select(ADRQ.c.asset_id, ADRQ.c.created_at).where(ADRQ.c.target_dag_id == dag_id)
    query = query.order_by(ADRQ.c.created_at.desc())
    return [(int(a), c) for a, c in conn.execute(query.with_for_update(skip_locked=True) if locks else query)]


def delete(conn: sa.Connection, dag_id: str, rows: Sequence[tuple[int, Any]]) -> None:
    """Delete exactly the queue rows of ``dag_id`` that :func:`queued` took."""
    taken = ADRQ.c.asset_id.in_([a for a, _ in rows])
    conn.execute(sa.delete(ADRQ).where(ADRQ.c.target_dag_id == dag_id, taken))


def window(conn: sa.Connection, dag_id: str, triggered: dt.datetime, floor: Any) -> list[int]:
    """The events of ``dag_id``'s assets with ``floor < timestamp <= triggered`` (``floor`` may be None)."""
    bounds = [EVENT.c.timestamp <= triggered] + ([EVENT.c.timestamp > floor] if floor is not None else [])
    assets = sa.select(REF.c.asset_id).where(REF.c.dag_id == dag_id)
    query = sa.select(EVENT.c.id).where(EVENT.c.asset_id.in_(assets), *bounds)
    return [int(e) for e in conn.scalars(query.order_by(EVENT.c.timestamp, EVENT.c.id))]


def floor_of(runs: Sequence[tuple[dt.datetime, Any]], triggered: dt.datetime) -> dt.datetime | None:
    """The newest ``run_after`` of ``runs`` below ``triggered`` (None if there is none)."""
    return max((run_after for run_after, _ in runs if run_after < triggered), default=None)


def take_dag(conn: sa.Connection, dag_id: str) -> bool:
    """``dags_needing_dagruns``' lock on the DAG's ``dag`` row (``FOR NO KEY UPDATE SKIP LOCKED``);
    False when another transaction holds it (a producer's ``FOR SHARE``): the DAG is skipped this pass."""
    dag = sa.select(DAG.c.dag_id).where(DAG.c.dag_id == dag_id)
    return conn.execute(dag.with_for_update(skip_locked=True, key_share=True)).first() is not None


def scheduler_pass(
    conn: sa.Connection, dag_id: str, *, locks: bool, runs: Sequence[Run], lock_dag: bool = True
) -> Run | None:
    """Airflow 3.3.2's scheduler for one DAG, on ``conn``'s open transaction; the run it would create.

    ``dags_needing_dagruns`` first takes the DAG's ``dag`` row (``FOR NO
    KEY UPDATE SKIP LOCKED``; MySQL ``FOR UPDATE SKIP LOCKED``) with
    ``locks`` and ``lock_dag``: a DAG whose row another transaction holds
    is skipped this pass (on InnoDB that includes a producer whose insert's
    FK check share-locked it). Then :func:`queued`, :func:`window` and
    :func:`delete`, the floor being the newest of ``runs`` below
    ``triggered_date``. The caller records the run once the transaction committed.
    """
    if locks and lock_dag and not take_dag(conn, dag_id):
        return None
    rows = queued(conn, dag_id, locks=locks)
    if not rows:
        return None
    triggered = rows[0][1]
    events = window(conn, dag_id, triggered, floor_of(runs, triggered))
    delete(conn, dag_id, rows)
    return triggered, events


#: The floor of last resort (Airflow: ``date.min``); UtcDateTime needs an aware value.
_FLOOR = dt.datetime(1970, 1, 2, tzinfo=dt.timezone.utc)


def recorded_pass(
    session: Session, dags: Sequence[str], consumed: list[tuple[int, str]], *, lock_dag: bool = False
) -> int:
    """One pass of Airflow 3.3.2's ``_create_dag_runs_asset_triggered`` over ``dags`` (catchup off).

    Per DAG, with ``lock_dag`` (where Airflow's scheduler takes row locks) first
    :func:`take_dag` as ``dags_needing_dagruns`` does, skipping a DAG another
    transaction holds; then :func:`queued`, :func:`window` and :func:`delete`, with floor =
    ``coalesce(max(run_after) of its earlier runs below triggered_date,
    min(created_at) of its references)``; the run recorded in
    :data:`.dataset.bench_run` with ``run_after = triggered_date``;
    ``(event_id, dag_id)`` appended to ``consumed``. Returns the runs
    created; the caller commits.
    """
    conn, run = session.connection(), dataset.bench_run
    runs = 0
    for dag in dags:
        if lock_dag and not take_dag(conn, dag):
            continue
        rows = queued(conn, dag)
        if not rows:
            continue
        triggered = rows[0][1]
        previous = sa.select(sa.func.max(run.c.run_after)).where(
            run.c.dag_id == dag, run.c.run_after < triggered
        )
        first_reference = sa.select(sa.func.min(REF.c.created_at)).where(REF.c.dag_id == dag)
        last_resort = sa.bindparam("floor", _FLOOR, type_=UtcDateTime())
        floor = sa.func.coalesce(previous.scalar_subquery(), first_reference.scalar_subquery(), last_resort)
        events = window(conn, dag, triggered, floor)
        values = {
            "dag_id": dag,
            "queued_rows": len(rows),
            "run_after": triggered,
            "consumed_events": len(events),
        }
        conn.execute(sa.insert(run).values(**values))
        consumed.extend((e, dag) for e in events)
        delete(conn, dag, rows)
        runs += 1
    return runs
