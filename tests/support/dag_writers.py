"""What the forced tests against Airflow's other writers of ``dag`` share.

A producer of asset ``x`` through airflow-adrq (counting on :data:`SENT`), the control that takes its
consumers' share locks blocking first, the DAG processor's ``find_orm_dags`` lock, and what counts as a
deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import register_asset_change
from airflow_adrq.errorcodes import RetryableKind, classify
from airflow_adrq.metrics import Recorded
from airflow_adrq.models import DagModel
from tests.factories import asset_ref

_DAG = DagModel.__table__
#: What the producers' queue writes counted (the operator's metrics).
SENT = Recorded()


def ours(session: Session) -> None:
    """airflow-adrq's producer: one event of asset ``x``, then COMMIT.

    ``"refresh"``: what ``"auto"`` is where the scheduler locks rows; on MariaDB, MySQL 8's path.
    """
    register_asset_change(asset=asset_ref("x"), session=session, on_conflict="refresh", metrics=SENT)
    session.commit()


def blocking_control(dag_ids: Sequence[str]) -> Callable[[Session], None]:
    """A producer that first share-locks ``dag_ids`` blocking, in byte order (a plain ``FOR SHARE``)."""

    def control(session: Session) -> None:
        conn = session.connection()
        by_bytes = _DAG.c.dag_id.collate("C") if conn.dialect.name == "postgresql" else _DAG.c.dag_id
        lock = sa.select(_DAG.c.dag_id).where(_DAG.c.dag_id.in_(dag_ids)).order_by(by_bytes)
        conn.execute(lock.with_for_update(read=True))
        ours(session)

    return control


def find_orm_dags(conn: sa.Connection, dag_id: str) -> None:
    """The DAG processor's lock on one row: ``SELECT ... FOR NO KEY UPDATE`` (MySQL: ``FOR UPDATE``)."""
    conn.execute(sa.select(_DAG.c.dag_id).where(_DAG.c.dag_id == dag_id).with_for_update(key_share=True))


def deadlocked(error: BaseException | None) -> bool:
    """Whether ``error`` is a deadlock (PostgreSQL 40P01, InnoDB 1213)."""
    found = classify(error) if error is not None else None
    return found is not None and found.kind is RetryableKind.DEADLOCK
