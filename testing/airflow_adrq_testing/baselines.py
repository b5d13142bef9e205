"""The loop versions airflow-adrq replaces, reproduced for the tests and the benchmark.

Nothing in the package calls these; the concurrency tests and ``airflow-adrq bench``
run them side by side with :func:`airflow_adrq.register_asset_change`
to compare the whole drop-in with the whole Airflow code path on a real
database.

:func:`register_asset_change` here is a copy of apache-airflow-core 3.3.2's
``AssetManager.register_asset_change`` (``airflow/assets/manager.py``) over
:mod:`airflow_adrq.models`, step by step and statement by statement:

1. the asset lookup: ``SELECT asset ... WHERE name = :name AND uri = :uri``
   with the ``active``, ``aliases`` and ``scheduled_dags -> dag`` joined
   loads. Our models have no ORM relationships, so the copy runs the same
   single LEFT OUTER JOIN SELECT with those entities in its columns; the ORM
   builds the same identity-mapped objects (one ``DagModel`` per consumer);
2. unknown asset: warning, ``None``; inactive: warning, continue;
3. ``_add_asset_alias_association``: ``SELECT asset_alias WHERE name IN
   (:names)`` (sent even with no names, as Airflow does), missing aliases
   created, missing ``asset_alias_asset`` links written with the event's flush;
4. the ``asset_event`` row, flushed at once (ORM insert);
5. direct consumers: ``{ref.dag for ref in scheduled_dags if not ref.dag.is_paused}``;
6. with ``source_alias_names``: ``SELECT asset_alias ... scheduled_dags -> dag``
   (one joined SELECT), then one ``INSERT INTO asset_alias_asset_event`` per
   alias, and the unpaused alias consumers;
7. ``Asset.ref`` consumers: ``SELECT dag LEFT JOIN name_ref LEFT JOIN uri_ref
   WHERE (name = :name OR uri = :uri) AND NOT is_paused``;
8. listener callbacks (``callback_sink`` or inline, as Airflow);
9. ``_queue_dagruns`` for the union (a Python ``set`` of ``DagModel``), non-partitioned
   DAGs only, nothing for an event with a ``partition_key``.

Statements per call without aliases, empty queue: PostgreSQL 5 (lookup,
alias SELECT, event INSERT, ref SELECT, one queue executemany); MySQL/MariaDB
and SQLite 4 + 4 per consumer DAG (SAVEPOINT, SELECT, INSERT, RELEASE).

Only step 9's non-partitioned branch differs between the baselines
(``queueing``):

``airflow_3_3``
    3.3.2 as released. PostgreSQL: ``insert(AssetDagRunQueue).values(asset_id=...)
    .on_conflict_do_nothing()`` with one parameter set per DAG, in set order
    (``_queue_dagruns_nonpartitioned_postgres``), an executemany: psycopg 3
    pipelines it (one round trip, one INSERT per row, in set order); psycopg2
    sends one multi-row INSERT. MySQL/MariaDB and SQLite: per DAG in set order ``with
    session.begin_nested(): session.merge(AssetDagRunQueue(...))``, catching
    only ``IntegrityError`` (``_queue_dagruns_nonpartitioned_slow_path``).
``sorted_loop``
    The same with the DAGs sorted by ``dag_id`` first (apache/airflow PR
    #70128, closed unmerged, all backends): removes the cycles between
    producers of one asset, not those between transactions that queue
    several assets.
``values_batch``
    apache/airflow PR #69977 (merged to main after 3.3): on MySQL/MariaDB one
    ``INSERT ... VALUES ... ON DUPLICATE KEY UPDATE`` no-op per event, rows in
    set order. That PR left PostgreSQL and SQLite unchanged, so there this
    baseline IS ``airflow_3_3``; the benchmark runs it on MySQL/MariaDB only
    (see :data:`VALUES_BATCH_DIALECTS`).

Set order. A ``set`` of ``DagModel`` objects hashes them by identity, so its
iteration order follows memory addresses: it differs between processes and
between calls, but processes started the same way (e.g. xdist workers) can
end up with very similar layouts. Rather than depend on that accident, the
benchmark passes ``rng`` (a :class:`random.Random` seeded from
``os.urandom`` in every process), and the baselines then iterate the set in a
uniformly random order per call: the worst case the real set order allows.
With ``rng=None`` they iterate the set itself, as Airflow does.

Not reproduced (not on the benchmark's path, or needs a running Airflow):
multi-team filtering, the ``asset.updates`` metric (a no-op without a
metrics backend), Airflow's listener manager (our
:func:`airflow_adrq.manager.notify` stands in), and the partitioned-DAG
path (``asset_partition_dag_run``; partitioned consumers are skipped with
Airflow's warning, without its ``log`` row). Our ``dag`` table is a subset of
Airflow's columns, so loading a ``DagModel`` costs less here than in Airflow.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, Literal, cast

from sqlalchemy import Table, and_, exc, insert, or_, select
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.orm import Session

from airflow_adrq.manager import AssetEventInfo, AssetLike, TaskInstanceLike, notify
from airflow_adrq.models import (
    AssetActive,
    AssetAliasModel,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagModel,
    DagScheduleAssetAliasReference,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
    alias_association_table,
    asset_alias_asset_event_association_table,
)

log = logging.getLogger(__name__)

Queueing = Literal["airflow_3_3", "sorted_loop", "values_batch"]

#: The baselines, in report order.
BASELINES: Final[tuple[Queueing, ...]] = ("airflow_3_3", "sorted_loop", "values_batch")

#: Dialects on which ``values_batch`` differs from ``airflow_3_3`` (PR #69977 changed MySQL only).
VALUES_BATCH_DIALECTS: Final = frozenset({"mysql", "mariadb"})

_ADRQ = cast(Table, AssetDagRunQueue.__table__)


def applies_to(queueing: str, dialect_name: str) -> bool:
    """Whether strategy ``queueing`` is its own code path on ``dialect_name``.

    ``values_batch`` is PR #69977's MySQL branch; on PostgreSQL and SQLite
    that PR left Airflow 3.3's code, so benchmarking it there would only
    measure ``airflow_3_3`` under another name.
    """
    return queueing != "values_batch" or dialect_name in VALUES_BATCH_DIALECTS


def _lookup(session: Session, name: str, uri: str) -> tuple[AssetModel, bool, set[str], set[DagModel]] | None:
    """One SELECT: the asset with ``active``, ``aliases`` and ``scheduled_dags -> dag`` (LEFT JOINs).

    Returns the asset, whether it is active, its alias names and its scheduled DAGs.
    """
    rows = session.execute(
        select(AssetModel, AssetActive, AssetAliasModel, DagScheduleAssetReference, DagModel)
        .select_from(AssetModel)
        .outerjoin(AssetActive, and_(AssetActive.name == AssetModel.name, AssetActive.uri == AssetModel.uri))
        .outerjoin(alias_association_table, alias_association_table.c.asset_id == AssetModel.id)
        .outerjoin(AssetAliasModel, AssetAliasModel.id == alias_association_table.c.alias_id)
        .outerjoin(DagScheduleAssetReference, DagScheduleAssetReference.asset_id == AssetModel.id)
        .outerjoin(DagModel, DagModel.dag_id == DagScheduleAssetReference.dag_id)
        .where(AssetModel.name == name, AssetModel.uri == uri)
    ).all()
    if not rows:
        return None
    aliases = {alias.name for _, _, alias, _, _ in rows if alias is not None}
    return rows[0][0], rows[0][1] is not None, aliases, {dag for *_, dag in rows if dag is not None}


def _add_asset_alias_association(
    session: Session, alias_names: Collection[str], already_related: set[str]
) -> list[AssetAliasModel]:
    """Airflow's ``_add_asset_alias_association``; returns the aliases to link at flush."""
    existing = {
        m.name: m
        for m in session.scalars(select(AssetAliasModel).where(AssetAliasModel.name.in_(alias_names)))
    }
    to_link = []
    for name in alias_names:
        if name in already_related:
            continue
        model = existing.get(name)
        if model is None:
            model = AssetAliasModel(name=name)
            session.add(model)
        to_link.append(model)
    return to_link


def _alias_consumers(session: Session, alias_names: Collection[str]) -> dict[AssetAliasModel, set[DagModel]]:
    """The aliases by name, each with its scheduled DAGs (one joined SELECT)."""
    rows = session.execute(
        select(AssetAliasModel, DagModel)
        .select_from(AssetAliasModel)
        .outerjoin(
            DagScheduleAssetAliasReference, DagScheduleAssetAliasReference.alias_id == AssetAliasModel.id
        )
        .outerjoin(DagModel, DagModel.dag_id == DagScheduleAssetAliasReference.dag_id)
        .where(AssetAliasModel.name.in_(alias_names))
    ).all()
    out: dict[AssetAliasModel, set[DagModel]] = {}
    for alias, dag in rows:
        out.setdefault(alias, set()).update([dag] if dag is not None else [])
    return out


def register_asset_change(
    *,
    asset: AssetLike,
    session: Session,
    task_instance: TaskInstanceLike | None = None,
    queueing: Queueing = "airflow_3_3",
    rng: random.Random | None = None,
    extra: Mapping[str, Any] | None = None,
    source_alias_names: Collection[str] = (),
    partition_key: str | None = None,
    callback_sink: list[Callable[[], object]] | None = None,
) -> AssetEvent | None:
    """Airflow 3.3.2's ``register_asset_change``, with ``queueing``'s queue write.

    Locks: the event row (new key); new alias rows and links; the queue rows
    one by one in set order (``sorted_loop``: ``dag_id`` order within the
    event), each held until the transaction ends (on MySQL/MariaDB
    ``values_batch`` also the existing duplicates, exclusively). Promises no
    lock order across producers or across the assets of one transaction:
    concurrent callers deadlock, which is what it is here to show.
    """
    loaded = _lookup(session, asset.name, asset.uri)
    if loaded is None:
        log.warning("AssetModel %s not found; cannot create asset event.", asset)
        return None
    asset_model, active, related_aliases, scheduled = loaded
    if not active:
        log.warning("Emitting event for inactive AssetModel %s", asset)

    to_link = _add_asset_alias_association(session, source_alias_names, related_aliases)

    fields = ("task_id", "dag_id", "run_id", "map_index")
    source = {} if task_instance is None else {f"source_{f}": getattr(task_instance, f) for f in fields}
    event = AssetEvent(
        asset_id=asset_model.id, extra=dict(extra or {}), partition_key=partition_key, **source
    )
    session.add(event)
    session.flush()  # "Ensure the event is written earlier than ADRQ entries below."
    if to_link:
        # Airflow writes these in the same flush, through asset_model.aliases.
        session.execute(
            insert(alias_association_table), [{"alias_id": a.id, "asset_id": asset_model.id} for a in to_link]
        )

    dags_from_asset = {dag for dag in scheduled if not dag.is_paused}

    dags_from_alias: set[DagModel] = set()
    alias_models = _alias_consumers(session, source_alias_names) if source_alias_names else {}
    for alias_model, alias_dags in alias_models.items():
        session.execute(
            insert(asset_alias_asset_event_association_table).values(
                alias_id=alias_model.id, event_id=event.id
            )
        )
        dags_from_alias |= {dag for dag in alias_dags if not dag.is_paused}

    by_name, by_uri = DagScheduleAssetNameReference, DagScheduleAssetUriReference
    dags_from_ref = set(
        session.scalars(
            select(DagModel)
            .join(by_name, by_name.dag_id == DagModel.dag_id, isouter=True)
            .join(by_uri, by_uri.dag_id == DagModel.dag_id, isouter=True)
            .where(or_(by_name.name == asset.name, by_uri.uri == asset.uri), DagModel.is_paused.is_(False))
        )
    )

    info = AssetEventInfo(
        event_id=event.id,
        asset_id=asset_model.id,
        asset_name=asset_model.name,
        asset_uri=asset_model.uri,
        extra=event.extra,
        source_alias_names=tuple(a.name for a in alias_models),
        partition_key=partition_key,
        **source,
    )
    if callback_sink is None:
        notify(info)
    else:
        callback_sink.append(functools.partial(notify, info))

    dags_to_queue = dags_from_asset | dags_from_alias | dags_from_ref
    _queue_dagruns(session, asset_model.id, dags_to_queue, partition_key, queueing, rng)
    return event


def _queue_dagruns(
    session: Session,
    asset_id: int,
    dags_to_queue: set[DagModel],
    partition_key: str | None,
    queueing: Queueing,
    rng: random.Random | None,
) -> None:
    partition_dags = [d for d in dags_to_queue if d.timetable_partitioned is True]
    if partition_dags and not partition_key:
        log.warning(
            "Listening Dags are partition-aware but the run has no partition key (listening_dags=%s)",
            [d.dag_id for d in partition_dags],
        )
    non_partitioned = dags_to_queue.difference(partition_dags)
    if not non_partitioned or partition_key is not None:
        return
    ordered = list(non_partitioned)
    if queueing == "sorted_loop":
        ordered.sort(key=lambda dag: dag.dag_id)
    elif rng is not None:
        rng.shuffle(ordered)
    dialect = session.get_bind().dialect.name
    if queueing == "values_batch" and dialect in VALUES_BATCH_DIALECTS:
        # PR #69977's _queue_dagruns_nonpartitioned_mysql: one INSERT ... ON
        # DUPLICATE KEY UPDATE no-op executed with one parameter set per DAG in
        # set order; mysqlclient sends it as one multi-row INSERT.
        upsert = mysql.insert(AssetDagRunQueue).values(asset_id=asset_id)
        session.execute(upsert.on_duplicate_key_update(asset_id=_ADRQ.c.asset_id), _targets(ordered))
    elif dialect == "postgresql":
        # _queue_dagruns_nonpartitioned_postgres, verbatim: one executemany, one
        # parameter set per DAG in set order. psycopg 3 pipelines the sets (one
        # round trip, one INSERT execution per row); psycopg2 sends one multi-row
        # INSERT (SQLAlchemy's insertmanyvalues).
        stmt = postgresql.insert(AssetDagRunQueue).values(asset_id=asset_id).on_conflict_do_nothing()
        session.execute(stmt, _targets(ordered))
    else:
        # _queue_dagruns_nonpartitioned_slow_path, verbatim: a deadlock inside the
        # SAVEPOINT is not an IntegrityError and propagates (on MariaDB as error
        # 1305 with 1213 further down the chain).
        for dag in ordered:
            item = AssetDagRunQueue(target_dag_id=dag.dag_id, asset_id=asset_id)
            try:
                with session.begin_nested():
                    session.merge(item)
            except exc.IntegrityError:
                log.debug("Skipping record %s", item, exc_info=True)


def _targets(dags: Sequence[DagModel]) -> list[dict[str, str]]:
    return [{"target_dag_id": dag.dag_id} for dag in dags]
