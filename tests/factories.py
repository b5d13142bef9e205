# mypy: ignore-errors
"""Rows for tests: DAGs, assets and schedule references, inserted set-based."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq.models import (
    AssetActive,
    AssetAliasModel,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagBundleModel,
    DagModel,
    DagScheduleAssetAliasReference,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
    utcnow,
)

BUNDLE = "test-bundle"


def asset_ref(name: str, uri: str | None = None) -> SimpleNamespace:
    """What callers pass as ``asset=``: anything with ``name`` and ``uri``."""
    return SimpleNamespace(name=name, uri=uri if uri is not None else f"s3://bucket/{name}")


def task_instance(dag_id="producer", task_id="emit", run_id="run-1", map_index=-1) -> SimpleNamespace:
    return SimpleNamespace(dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index)


def add_dags(session: Session, dag_ids: Iterable[str], *, paused=(), partitioned=()) -> None:
    if session.get(DagBundleModel, BUNDLE) is None:
        session.add(DagBundleModel(name=BUNDLE))
        session.flush()
    rows = [
        {
            "dag_id": d,
            "is_paused": d in paused,
            "is_stale": False,
            "bundle_name": BUNDLE,
            "timetable_partitioned": d in partitioned,
        }
        for d in dag_ids
    ]
    if rows:
        session.execute(sa.insert(DagModel.__table__), rows)


def add_asset(session: Session, name: str, uri: str | None = None, *, active=True) -> int:
    ref = asset_ref(name, uri)
    asset = AssetModel(name=ref.name, uri=ref.uri)
    session.add(asset)
    session.flush()
    if active:
        session.add(AssetActive(name=ref.name, uri=ref.uri))
        session.flush()
    return asset.id


def add_alias(session: Session, name: str) -> int:
    alias = AssetAliasModel(name=name)
    session.add(alias)
    session.flush()
    return alias.id


def schedule_on_asset(session: Session, asset_id: int, dag_ids: Iterable[str]) -> None:
    now = utcnow()
    rows = [{"asset_id": asset_id, "dag_id": d, "created_at": now, "updated_at": now} for d in dag_ids]
    if rows:
        session.execute(sa.insert(DagScheduleAssetReference.__table__), rows)


def schedule_on_name(session: Session, name: str, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(DagScheduleAssetNameReference(name=name, dag_id=d))
    session.flush()


def schedule_on_uri(session: Session, uri: str, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(DagScheduleAssetUriReference(uri=uri, dag_id=d))
    session.flush()


def schedule_on_alias(session: Session, alias_id: int, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(DagScheduleAssetAliasReference(alias_id=alias_id, dag_id=d))
    session.flush()


def queued(session_or_engine) -> set[tuple[int, str]]:
    """The (asset_id, target_dag_id) rows of asset_dag_run_queue."""
    stmt = sa.select(AssetDagRunQueue.asset_id, AssetDagRunQueue.target_dag_id)
    if isinstance(session_or_engine, sa.Engine):
        with session_or_engine.connect() as conn:
            return {tuple(r) for r in conn.execute(stmt)}
    return {tuple(r) for r in session_or_engine.execute(stmt)}


def events(engine: sa.Engine) -> list[AssetEvent]:
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(sa.select(AssetEvent).order_by(AssetEvent.id)))
