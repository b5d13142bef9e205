"""The loop versions airflow-adrq replaces, reproduced for the benchmark only.

Nothing in the package calls these; ``airflow-adrq bench`` and the
concurrency tests run them side by side with :mod:`airflow_adrq.queue` to show
the difference on a real database. Each one queues the downstream DAGs of ONE
asset, in the caller's transaction, exactly as the Airflow code it is named
after does (the non-partitioned path of ``AssetManager._queue_dagruns``):

``airflow_3_3``
    apache-airflow-core 3.3.2, ``airflow/assets/manager.py``. The DAGs come
    from a Python ``set`` of freshly loaded ``DagModel`` objects (direct
    references plus ``Asset.ref(name=...)``/``Asset.ref(uri=...)``
    references, unpaused only). PostgreSQL: one ``INSERT ... ON CONFLICT DO
    NOTHING`` executed with one parameter set per DAG, in set order
    (``_queue_dagruns_nonpartitioned_postgres``). MySQL/MariaDB and SQLite:
    per DAG in set order ``with session.begin_nested():
    session.merge(AssetDagRunQueue(...))``, catching only ``IntegrityError``
    (``_queue_dagruns_nonpartitioned_slow_path``): SAVEPOINT, SELECT, INSERT,
    RELEASE per DAG.
``sorted_loop``
    The same code with the DAGs sorted by ``dag_id`` first (apache/airflow
    PR #70128, closed unmerged): removes the cycles between producers of one
    asset, not those between transactions that queue several assets.
``values_batch``
    One multi-row ``INSERT ... VALUES`` upsert per asset, rows in set order
    (apache/airflow PR #69977, merged to main after 3.3: MySQL ``ON DUPLICATE
    KEY UPDATE`` no-op; PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``).

Set order. A ``set`` of ``DagModel`` objects hashes them by identity, so its
iteration order follows memory addresses: it differs between processes and
between calls, but processes started the same way (e.g. xdist workers) can
end up with very similar layouts. Rather than depend on that accident, the
benchmark passes ``rng`` (a :class:`random.Random` seeded from
``os.urandom`` in every process), and the baselines then iterate the set in a
uniformly random order per call: the worst case the real set order allows.
With ``rng=None`` they iterate the set itself, as Airflow does.

Alias references are not modelled (the benchmark does not emit through
aliases); partitioned DAGs are skipped, as Airflow sends them elsewhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Final, cast

from sqlalchemy import Table, exc, or_, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from airflow_adrq import dialects
from airflow_adrq.models import (
    AssetDagRunQueue,
    AssetModel,
    DagModel,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
    utcnow,
)

__all__ = ["BASELINES", "Baseline", "airflow_3_3", "dags_to_queue", "sorted_loop", "values_batch"]

#: ``baseline(session, asset_id, *, rng)`` queues one asset's consumers.
Baseline = Callable[..., None]


def dags_to_queue(session: Session, asset_id: int) -> set[DagModel]:
    """Airflow 3.3.2's ``dags_to_queue`` for an event without aliases.

    Freshly loaded ``DagModel`` objects: unpaused DAGs referencing the asset
    directly, by name or by URI, minus those with a partitioned timetable.
    Plain SELECTs, no locks.
    """
    asset = session.get(AssetModel, asset_id)
    if asset is None:
        raise ValueError(f"no asset with id {asset_id}")
    direct = set(
        session.scalars(
            select(DagModel)
            .join(DagScheduleAssetReference, DagScheduleAssetReference.dag_id == DagModel.dag_id)
            .where(DagScheduleAssetReference.asset_id == asset_id, DagModel.is_paused.is_(False))
        )
    )
    by_ref = set(
        session.scalars(
            select(DagModel)
            .join(
                DagScheduleAssetNameReference,
                DagScheduleAssetNameReference.dag_id == DagModel.dag_id,
                isouter=True,
            )
            .join(
                DagScheduleAssetUriReference,
                DagScheduleAssetUriReference.dag_id == DagModel.dag_id,
                isouter=True,
            )
            .where(
                or_(
                    DagScheduleAssetNameReference.name == asset.name,
                    DagScheduleAssetUriReference.uri == asset.uri,
                ),
                DagModel.is_paused.is_(False),
            )
        )
    )
    return {dag for dag in direct | by_ref if dag.timetable_partitioned is not True}


def _set_order(dags: set[DagModel], rng: random.Random | None) -> list[DagModel]:
    ordered = list(dags)
    if rng is not None:
        rng.shuffle(ordered)
    return ordered


def _executemany_on_conflict(session: Session, asset_id: int, dags: Iterable[DagModel]) -> None:
    # airflow/assets/manager.py::_queue_dagruns_nonpartitioned_postgres, verbatim.
    values = [{"target_dag_id": dag.dag_id} for dag in dags]
    stmt = postgresql.insert(AssetDagRunQueue).values(asset_id=asset_id).on_conflict_do_nothing()
    session.execute(stmt, values)


def _savepoint_merge_loop(session: Session, asset_id: int, dags: Iterable[DagModel]) -> None:
    # airflow/assets/manager.py::_queue_dagruns_nonpartitioned_slow_path: a
    # deadlock inside the SAVEPOINT is not an IntegrityError and propagates
    # (on MariaDB as error 1305 with 1213 further down the chain).
    for dag in dags:
        item = AssetDagRunQueue(target_dag_id=dag.dag_id, asset_id=asset_id)
        try:
            with session.begin_nested():
                session.merge(item)
        except exc.IntegrityError:
            pass


# Airflow 3.3.2 picks its path by dialect name: PostgreSQL has the bulk
# statement, everything else the SAVEPOINT loop.
_AIRFLOW_3_3_PATHS: Final[dict[str, Callable[[Session, int, Iterable[DagModel]], None]]] = {
    "postgresql": _executemany_on_conflict,
}


def _airflow_3_3_path(session: Session) -> Callable[[Session, int, Iterable[DagModel]], None]:
    name = session.get_bind().dialect.name
    return _AIRFLOW_3_3_PATHS.get(name, _savepoint_merge_loop)


def airflow_3_3(session: Session, asset_id: int, *, rng: random.Random | None = None) -> None:
    """Queue like apache-airflow-core 3.3.2 (rows in set order).

    Locks: each ADRQ row as it is inserted (or, for a duplicate, waits for
    its uncommitted inserter), in set order, until the transaction ends;
    FK parent rows shared. Does not promise anything about lock order:
    concurrent callers deadlock, which is what it is here to show.
    """
    dags = dags_to_queue(session, asset_id)
    if dags:
        _airflow_3_3_path(session)(session, asset_id, _set_order(dags, rng))


def sorted_loop(session: Session, asset_id: int, *, rng: random.Random | None = None) -> None:
    """Queue like 3.3.2 with the DAGs sorted by ``dag_id`` (apache/airflow PR #70128).

    Locks: as :func:`airflow_3_3`, in ``dag_id`` order within the asset.
    Does not order rows across assets queued in one transaction. ``rng`` is
    accepted for a uniform signature and ignored.
    """
    dags = dags_to_queue(session, asset_id)
    if dags:
        _airflow_3_3_path(session)(session, asset_id, sorted(dags, key=lambda dag: dag.dag_id))


def values_batch(session: Session, asset_id: int, *, rng: random.Random | None = None) -> None:
    """One multi-row ``INSERT ... VALUES`` upsert, rows in set order (apache/airflow PR #69977).

    Locks: the ADRQ rows in VALUES order (MySQL/MariaDB: also the existing
    duplicates, exclusively, via the no-op ``ON DUPLICATE KEY UPDATE``) until
    the transaction ends. Does not promise a lock order.
    """
    dags = dags_to_queue(session, asset_id)
    if not dags:
        return
    created_at = utcnow()
    rows = [
        {"asset_id": asset_id, "target_dag_id": dag.dag_id, "created_at": created_at}
        for dag in _set_order(dags, rng)
    ]
    stmt = dialects.get(session).insert_ignore(cast(Table, AssetDagRunQueue.__table__)).values(rows)
    session.execute(stmt)


BASELINES: Final[dict[str, Baseline]] = {
    "airflow_3_3": airflow_3_3,
    "sorted_loop": sorted_loop,
    "values_batch": values_batch,
}
