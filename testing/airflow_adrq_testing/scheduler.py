"""What Airflow 3.3.2's scheduler does to the queue, once for every consumer the benchmark runs.

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

from airflow_adrq.models import AssetDagRunQueue, AssetEvent, DagScheduleAssetReference

ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)
EVENT = cast(sa.Table, AssetEvent.__table__)
REF = cast(sa.Table, DagScheduleAssetReference.__table__)


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
