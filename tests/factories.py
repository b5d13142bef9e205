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
    alias_association_table,
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


# --- set-based bulk setup (Core executemany; for large or generated graphs) ---


def add_assets(
    session: Session, refs: Iterable[tuple[str, str]], *, inactive=()
) -> dict[tuple[str, str], int]:
    """Insert many assets in one executemany; active unless ``(name, uri)`` is in ``inactive``.

    Returns ``(name, uri) -> id`` for the assets inserted here.
    """
    refs = list(refs)
    inactive = set(inactive)
    now = utcnow()
    if not refs:
        return {}
    session.execute(
        sa.insert(AssetModel.__table__),
        [
            {"name": n, "uri": u, "group": "", "extra": {}, "created_at": now, "updated_at": now}
            for n, u in refs
        ],
    )
    active_rows = [{"name": n, "uri": u} for n, u in refs if (n, u) not in inactive]
    if active_rows:
        session.execute(sa.insert(AssetActive.__table__), active_rows)
    wanted = set(refs)
    asset = AssetModel.__table__
    return {
        (n, u): i
        for n, u, i in session.execute(sa.select(asset.c.name, asset.c.uri, asset.c.id))
        if (n, u) in wanted
    }


def add_aliases(session: Session, names: Iterable[str]) -> dict[str, int]:
    """Insert many aliases in one executemany; returns name -> id for them."""
    names = list(names)
    if not names:
        return {}
    session.execute(sa.insert(AssetAliasModel.__table__), [{"name": n, "group": ""} for n in names])
    wanted = set(names)
    alias = AssetAliasModel.__table__
    return {n: i for n, i in session.execute(sa.select(alias.c.name, alias.c.id)) if n in wanted}


def add_schedule_refs(
    session: Session,
    *,
    direct: Iterable[tuple[int, str]] = (),
    by_name: Iterable[tuple[str, str]] = (),
    by_uri: Iterable[tuple[str, str]] = (),
    by_alias: Iterable[tuple[int, str]] = (),
) -> None:
    """Insert schedule references of every kind, one executemany per kind.

    ``direct``: (asset_id, dag_id); ``by_name``: (name, dag_id); ``by_uri``:
    (uri, dag_id); ``by_alias``: (alias_id, dag_id).
    """
    now = utcnow()
    batches = [
        (DagScheduleAssetReference, [{"asset_id": a, "dag_id": d, "updated_at": now} for a, d in direct]),
        (DagScheduleAssetNameReference, [{"name": n, "dag_id": d} for n, d in by_name]),
        (DagScheduleAssetUriReference, [{"uri": u, "dag_id": d} for u, d in by_uri]),
        (
            DagScheduleAssetAliasReference,
            [{"alias_id": a, "dag_id": d, "updated_at": now} for a, d in by_alias],
        ),
    ]
    for model, rows in batches:
        if rows:
            session.execute(sa.insert(model.__table__), [{"created_at": now, **r} for r in rows])


def link_aliases(session: Session, pairs: Iterable[tuple[int, int]]) -> None:
    """asset_alias_asset rows for (alias_id, asset_id) pairs, one executemany."""
    rows = [{"alias_id": a, "asset_id": s} for a, s in pairs]
    if rows:
        session.execute(sa.insert(alias_association_table), rows)


def queue_rows(engine: sa.Engine) -> dict[tuple[int, str], object]:
    """asset_dag_run_queue as (asset_id, target_dag_id) -> created_at."""
    adrq = AssetDagRunQueue.__table__
    with engine.connect() as conn:
        return {
            (a, d): created
            for a, d, created in conn.execute(
                sa.select(adrq.c.asset_id, adrq.c.target_dag_id, adrq.c.created_at)
            )
        }
