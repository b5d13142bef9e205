"""Rows for tests: DAGs, assets and schedule references, inserted set-based."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import models

BUNDLE = "test-bundle"


def asset_ref(name: str, uri: str | None = None) -> SimpleNamespace:
    """What callers pass as ``asset=``: anything with ``name`` and ``uri``."""
    return SimpleNamespace(name=name, uri=uri if uri is not None else f"s3://bucket/{name}")


def task_instance(dag_id="producer", task_id="emit", run_id="run-1", map_index=-1) -> SimpleNamespace:
    """What callers pass as ``task_instance=``: the attributes the event's source columns take."""
    return SimpleNamespace(dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index)


def add_dags(session: Session, dag_ids: Iterable[str], *, paused=(), partitioned=()) -> None:
    if session.get(models.DagBundleModel, BUNDLE) is None:
        session.add(models.DagBundleModel(name=BUNDLE))
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
        session.execute(sa.insert(models.DagModel.__table__), rows)


def add_asset(session: Session, name: str, uri: str | None = None, *, active=True) -> int:
    ref = asset_ref(name, uri)
    asset = models.AssetModel(name=ref.name, uri=ref.uri)
    session.add(asset)
    session.flush()
    if active:
        session.add(models.AssetActive(name=ref.name, uri=ref.uri))
        session.flush()
    return asset.id


def add_alias(session: Session, name: str) -> int:
    alias = models.AssetAliasModel(name=name)
    session.add(alias)
    session.flush()
    return alias.id


def schedule_on_asset(session: Session, asset_id: int, dag_ids: Iterable[str]) -> None:
    now = models.utcnow()
    rows = [{"asset_id": asset_id, "dag_id": d, "created_at": now, "updated_at": now} for d in dag_ids]
    if rows:
        session.execute(sa.insert(models.DagScheduleAssetReference.__table__), rows)


def schedule_on_name(session: Session, name: str, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(models.DagScheduleAssetNameReference(name=name, dag_id=d))
    session.flush()


def schedule_on_uri(session: Session, uri: str, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(models.DagScheduleAssetUriReference(uri=uri, dag_id=d))
    session.flush()


def schedule_on_alias(session: Session, alias_id: int, dag_ids: Iterable[str]) -> None:
    for d in dag_ids:
        session.add(models.DagScheduleAssetAliasReference(alias_id=alias_id, dag_id=d))
    session.flush()


def add_scheduled_assets(
    session: Session,
    consumers: Mapping[str, Iterable[str]],
    *,
    uris: Mapping[str, str] | None = None,
    active=True,
    paused=(),
    partitioned=(),
) -> dict[str, int]:
    """Assets by name, each scheduled directly by its consumer DAGs (created here, once each
    however many assets they consume); returns name -> asset id.

    The setup most tests start from; ``uris`` overrides :func:`asset_ref`'s URI per name.
    """
    consumers = {name: list(dag_ids) for name, dag_ids in consumers.items()}
    # In the order given, not sorted: a test of ordering (the collation one) inserts DAGs
    # in an order that is neither Python's nor the database's.
    dag_ids = dict.fromkeys(d for ds in consumers.values() for d in ds)
    add_dags(session, dag_ids, paused=paused, partitioned=partitioned)
    ids = {}
    for name, dag_ids in consumers.items():
        ids[name] = add_asset(session, name, (uris or {}).get(name), active=active)
        schedule_on_asset(session, ids[name], dag_ids)
    return ids


def _rows(source, stmt) -> list[tuple]:
    """``stmt``'s rows as tuples, from an Engine (its own connection) or a Session/Connection."""
    if isinstance(source, sa.Engine):
        with source.connect() as conn:
            return [tuple(r) for r in conn.execute(stmt)]
    return [tuple(r) for r in source.execute(stmt)]


def queued(session_or_engine) -> set[tuple[int, str]]:
    """The (asset_id, target_dag_id) rows of asset_dag_run_queue."""
    adrq = models.AssetDagRunQueue
    return set(_rows(session_or_engine, sa.select(adrq.asset_id, adrq.target_dag_id)))


def stored_aliases(source) -> dict[str, int]:
    """asset_alias as name -> id."""
    alias = models.AssetAliasModel
    return dict(_rows(source, sa.select(alias.name, alias.id)))


# Lists, not sets, for the two association tables: a test that expects one row
# sees a second one.


def alias_links(source) -> list[tuple[int, int]]:
    """asset_alias_asset as sorted (alias_id, asset_id) rows."""
    table = models.alias_association_table
    return sorted(_rows(source, sa.select(table.c.alias_id, table.c.asset_id)))


def alias_event_links(source) -> list[tuple[int, int]]:
    """asset_alias_asset_event as sorted (alias_id, event_id) rows."""
    table = models.asset_alias_asset_event_association_table
    return sorted(_rows(source, sa.select(table.c.alias_id, table.c.event_id)))


def events(engine: sa.Engine) -> list[models.AssetEvent]:
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(sa.select(models.AssetEvent).order_by(models.AssetEvent.id)))


# --- set-based bulk setup (Core executemany; for large or generated graphs) ---


def add_assets(
    session: Session, refs: Iterable[tuple[str, str]], *, inactive=()
) -> dict[tuple[str, str], int]:
    """Insert many assets in one executemany; active unless ``(name, uri)`` is in ``inactive``.

    Returns ``(name, uri) -> id`` for the assets inserted here.
    """
    refs = list(refs)
    inactive = set(inactive)
    now = models.utcnow()
    if not refs:
        return {}
    session.execute(
        sa.insert(models.AssetModel.__table__),
        [
            {"name": n, "uri": u, "group": "", "extra": {}, "created_at": now, "updated_at": now}
            for n, u in refs
        ],
    )
    active_rows = [{"name": n, "uri": u} for n, u in refs if (n, u) not in inactive]
    if active_rows:
        session.execute(sa.insert(models.AssetActive.__table__), active_rows)
    wanted = set(refs)
    asset = models.AssetModel.__table__
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
    session.execute(sa.insert(models.AssetAliasModel.__table__), [{"name": n, "group": ""} for n in names])
    wanted = set(names)
    alias = models.AssetAliasModel.__table__
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
    now = models.utcnow()
    batches = [
        (
            models.DagScheduleAssetReference,
            [{"asset_id": a, "dag_id": d, "updated_at": now} for a, d in direct],
        ),
        (models.DagScheduleAssetNameReference, [{"name": n, "dag_id": d} for n, d in by_name]),
        (models.DagScheduleAssetUriReference, [{"uri": u, "dag_id": d} for u, d in by_uri]),
        (
            models.DagScheduleAssetAliasReference,
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
        session.execute(sa.insert(models.alias_association_table), rows)


def add_graph(
    session: Session,
    *,
    dags: Iterable[str] = (),
    paused=(),
    partitioned=(),
    assets: Iterable[tuple[str, str]] = (),
    inactive=(),
    aliases: Iterable[str] = (),
    direct: Iterable[tuple[tuple[str, str], str]] = (),
    by_name: Iterable[tuple[str, str]] = (),
    by_uri: Iterable[tuple[str, str]] = (),
    by_alias: Iterable[tuple[str, str]] = (),
    links: Iterable[tuple[str, tuple[str, str]]] = (),
) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """A whole reference graph, set-based, described by value rather than by id.

    Assets are ``(name, uri)`` keys and aliases names: ``direct`` is (asset key, dag_id),
    ``by_name`` (name, dag_id), ``by_uri`` (uri, dag_id), ``by_alias`` (alias name, dag_id)
    and ``links`` (alias name, asset key). Rows go in sorted by id, so the same graph is
    inserted in the same order every time. Returns (asset key -> id, alias name -> id).
    """
    add_dags(session, dags, paused=paused, partitioned=partitioned)
    asset_ids = add_assets(session, assets, inactive=inactive)
    alias_ids = add_aliases(session, aliases)
    add_schedule_refs(
        session,
        direct=sorted((asset_ids[k], d) for k, d in direct),
        by_name=sorted(by_name),
        by_uri=sorted(by_uri),
        by_alias=sorted((alias_ids[a], d) for a, d in by_alias),
    )
    link_aliases(session, sorted((alias_ids[a], asset_ids[k]) for a, k in links))
    return asset_ids, alias_ids


def queue_rows(engine: sa.Engine) -> dict[tuple[int, str], object]:
    """asset_dag_run_queue as (asset_id, target_dag_id) -> created_at."""
    adrq = models.AssetDagRunQueue.__table__
    with engine.connect() as conn:
        return {
            (a, d): created
            for a, d, created in conn.execute(
                sa.select(adrq.c.asset_id, adrq.c.target_dag_id, adrq.c.created_at)
            )
        }
