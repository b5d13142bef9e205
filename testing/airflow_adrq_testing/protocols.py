"""The stamping protocols airflow-adrq used before its present one, for the race tests and the residual run.

Each writes one ``asset_event`` per asset (the same work before the queue in
every protocol), then queues and stamps them its way, and commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import dialects
from airflow_adrq.manager import build_queue_statement
from airflow_adrq.models import AssetDagRunQueue, AssetEvent, utcnow
from airflow_adrq.refresh import PENDING

__all__ = ["events", "landed", "stamp_first"]

_EVENT = cast(sa.Table, AssetEvent.__table__)
_ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)


def events(conn: sa.Connection, asset_ids: Sequence[int]) -> list[int]:
    """One ``asset_event`` per asset, Python's clock on it; their ids."""
    insert = sa.insert(_EVENT).returning(_EVENT.c.id)
    return [
        conn.execute(insert.values(asset_id=a, extra={}, timestamp=utcnow())).scalar_one() for a in asset_ids
    ]


def stamp_first(session: Session, asset_ids: Sequence[int]) -> list[int]:
    """The protocol before the fix: the events, Python's clock on them, then the statement; COMMIT."""
    conn = session.connection()
    ids = events(conn, asset_ids)
    stamp = utcnow()
    conn.execute(sa.update(_EVENT).where(_EVENT.c.id.in_(ids)).values(timestamp=stamp))
    conn.execute(
        build_queue_statement(conn.dialect, on_conflict="refresh"), {"ids": ids, "created_at": stamp}
    )
    session.commit()
    return ids


def landed(session: Session, asset_ids: Sequence[int]) -> list[int]:
    """The protocol before the ``dag`` share lock: rows written at PENDING, then the clock on rows and events.

    The plug-in as it was where the scheduler locks rows: the one ordered
    statement with ``created_at = PENDING``, then, with every row locked,
    the database's clock put on the events and on those rows (a second write
    of each row); COMMIT. No ``dag`` row lock.
    """
    conn = session.connection()
    ids = events(conn, asset_ids)
    conn.execute(
        build_queue_statement(conn.dialect, on_conflict="refresh"), {"ids": ids, "created_at": PENDING}
    )
    clock = dialects.get(conn).clock
    stamp = conn.execute(sa.select(clock())).scalar_one() if clock is not None else utcnow()
    conn.execute(sa.update(_EVENT).where(_EVENT.c.id.in_(ids)).values(timestamp=stamp))
    pending = _ADRQ.c.asset_id.in_(list(asset_ids)) & (_ADRQ.c.created_at == PENDING)
    conn.execute(sa.update(_ADRQ).where(pending).values(created_at=stamp))
    session.commit()
    return ids
