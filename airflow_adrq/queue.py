"""Queue downstream DAG runs with ONE ordered, set-based statement.

The statement (PostgreSQL rendering; the conflict clause is per dialect)::

    INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at)
    SELECT src.asset_id, src.dag_id, :created_at
    FROM (
        -- DAGs scheduled directly on the assets
        SELECT r.asset_id, r.dag_id FROM dag_schedule_asset_reference r
         WHERE r.asset_id IN (:asset_ids)
        UNION  -- DAGs scheduled on Asset.ref(name=...)
        SELECT a.id, n.dag_id FROM asset a JOIN dag_schedule_asset_name_reference n ON n.name = a.name
         WHERE a.id IN (:asset_ids)
        UNION  -- DAGs scheduled on Asset.ref(uri=...)
        SELECT a.id, u.dag_id FROM asset a JOIN dag_schedule_asset_uri_reference u ON u.uri = a.uri
         WHERE a.id IN (:asset_ids)
        UNION  -- DAGs scheduled on an alias the event was emitted through
        SELECT CAST(:asset_id AS INTEGER), ar.dag_id FROM dag_schedule_asset_alias_reference ar
          JOIN asset_alias al ON al.id = ar.alias_id
         WHERE al.name IN (:alias_names)  -- one such SELECT per asset with aliases
    ) AS src
    JOIN dag ON dag.dag_id = src.dag_id
    WHERE dag.is_paused = false AND dag.timetable_partitioned = false
    ORDER BY src.asset_id, src.dag_id
    ON CONFLICT (asset_id, target_dag_id) DO NOTHING

Why this shape:

* **Lock order.** The rows are inserted, and so locked, in primary-key order
  ``(asset_id, target_dag_id)``. Two transactions that queue overlapping rows
  wait for each other in the same order and cannot form a cycle on this
  table. ``ORDER BY`` sits at the top level because MariaDB may ignore it
  inside a derived table. Neither PostgreSQL nor MySQL documents that
  ``INSERT ... SELECT ... ORDER BY`` inserts in that order, though both do;
  the concurrency tests fail if that stops being true.
* **One statement per transaction.** A task with several outlets registers
  each asset separately. Queued one statement per asset, two such tasks
  still lock ``(A, d)`` and ``(B, d)`` in opposite orders. :func:`defer_dagruns`
  collects a transaction's assets and queues them all in one statement just
  before COMMIT, which also keeps the queue rows locked only for the commit.
* **No per-DAG parameters.** The DAG set comes from the reference tables in
  the database, so fan-out does not change the statement's size: the bound
  parameters are the asset ids, the alias names and the timestamp.
* **Same rows as Airflow 3.3.** Direct, alias, name and URI references;
  unpaused DAGs only; each (asset, DAG) once; DAGs with a partitioned
  timetable are never put in this queue (Airflow sends them to
  ``asset_partition_dag_run`` instead). Like Airflow, stale DAGs are queued
  and filtered by the scheduler.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    CompoundSelect,
    Integer,
    Select,
    Table,
    bindparam,
    false,
    literal,
    select,
    union,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from airflow_adrq import dialects
from airflow_adrq.dialects import ConflictMode
from airflow_adrq.models import (
    AssetAliasModel,
    AssetDagRunQueue,
    AssetModel,
    DagModel,
    DagScheduleAssetAliasReference,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
    UtcDateTime,
    utcnow,
)
from airflow_adrq.txscope import DeferredWrites

__all__ = [
    "QueueTarget",
    "build_queue_statement",
    "defer_dagruns",
    "discard_pending",
    "flush_queue",
    "pending_targets",
    "queue_dagruns",
]

_ADRQ = cast(Table, AssetDagRunQueue.__table__)
_ADRQ_KEY = ("asset_id", "target_dag_id")


@dataclass(frozen=True, order=True)
class QueueTarget:
    """An asset whose downstream DAGs are to be queued.

    ``alias_names`` are the aliases the event was emitted through; DAGs
    scheduled on those aliases are queued for this asset too.
    """

    asset_id: int
    alias_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.asset_id, bool) or not isinstance(self.asset_id, int):
            raise TypeError(f"asset_id must be an int, not {self.asset_id!r}")
        if isinstance(self.alias_names, str):
            raise TypeError("alias_names must be a collection of names, not a single string")


def _merge(targets: Iterable[QueueTarget | int]) -> dict[int, set[str]]:
    """asset id -> alias names, merged over duplicate targets."""
    merged: dict[int, set[str]] = {}
    for target in targets:
        if not isinstance(target, QueueTarget):
            target = QueueTarget(target)
        merged.setdefault(target.asset_id, set()).update(target.alias_names)
    return merged


def _source_select(merged: Mapping[int, set[str]]) -> CompoundSelect[Any]:
    """UNION of (asset_id, dag_id) pairs from every kind of schedule reference."""
    asset = AssetModel.__table__
    ids: BindParameter[Any] = bindparam("asset_ids", sorted(merged), expanding=True)
    direct = DagScheduleAssetReference.__table__
    by_name = DagScheduleAssetNameReference.__table__
    by_uri = DagScheduleAssetUriReference.__table__
    parts: list[Select[Any]] = [
        select(direct.c.asset_id.label("asset_id"), direct.c.dag_id.label("dag_id")).where(
            direct.c.asset_id.in_(ids)
        ),
        select(asset.c.id, by_name.c.dag_id)
        .join(by_name, by_name.c.name == asset.c.name)
        .where(asset.c.id.in_(ids)),
        select(asset.c.id, by_uri.c.dag_id)
        .join(by_uri, by_uri.c.uri == asset.c.uri)
        .where(asset.c.id.in_(ids)),
    ]
    with_aliases = {asset_id: names for asset_id, names in sorted(merged.items()) if names}
    if with_aliases:
        alias = AssetAliasModel.__table__
        alias_ref = DagScheduleAssetAliasReference.__table__
        # An alias counts only for the asset whose event went through it, so
        # each asset carries its own alias names (params per asset, not per DAG).
        for asset_id, names in with_aliases.items():
            parts.append(
                select(sql_cast(literal(asset_id, Integer), Integer), alias_ref.c.dag_id)
                .join(alias, alias.c.id == alias_ref.c.alias_id)
                .where(alias.c.name.in_(sorted(names)))
            )
    return union(*parts)


def build_queue_statement(
    targets: Iterable[QueueTarget | int],
    *,
    dialect: Dialect | str,
    created_at: dt.datetime | None = None,
    on_conflict: ConflictMode = "ignore",
) -> Insert:
    """Build the one ``INSERT ... SELECT ... ORDER BY`` that queues ``targets``.

    ``on_conflict="ignore"`` leaves an already-queued row as it is (Airflow's
    behaviour); ``"refresh"`` sets its ``created_at`` to the greater of the
    old and new values, so a newer event is never represented by an older
    timestamp. Raises :class:`ValueError` for an empty target set.
    """
    merged = _merge(targets)
    if not merged:
        raise ValueError("no targets to queue")
    if on_conflict not in ("ignore", "refresh"):
        raise ValueError(f"on_conflict must be 'ignore' or 'refresh', not {on_conflict!r}")
    src = _source_select(merged).subquery("src")
    dag = DagModel.__table__
    rows = (
        select(
            src.c.asset_id,
            src.c.dag_id,
            bindparam("created_at", created_at or utcnow(), type_=UtcDateTime()),
        )
        .join(dag, dag.c.dag_id == src.c.dag_id)
        .where(dag.c.is_paused == false(), dag.c.timetable_partitioned == false())
        .order_by(src.c.asset_id, src.c.dag_id)
    )
    columns = [_ADRQ.c.asset_id, _ADRQ.c.target_dag_id, _ADRQ.c.created_at]
    return dialects.get(dialect).insert_from_select(
        _ADRQ, columns, rows, _ADRQ_KEY, on_conflict, "created_at"
    )


def queue_dagruns(
    bind: Session | Connection,
    targets: Iterable[QueueTarget | int],
    *,
    created_at: dt.datetime | None = None,
    on_conflict: ConflictMode = "ignore",
) -> None:
    """Queue the downstream DAGs of ``targets`` now, with one statement.

    Runs in the caller's transaction and does not commit.

    Locks: inserts (and with MySQL/MariaDB's no-op ``ON DUPLICATE KEY UPDATE``
    also locks the existing duplicates of) the ``asset_dag_run_queue`` rows in
    ``(asset_id, target_dag_id)`` order, held until the caller's transaction
    ends; FK checks take shared locks on the ``asset`` and ``dag`` parent rows
    (PostgreSQL ``FOR KEY SHARE``). Reads the reference tables and ``dag``
    without locking them (READ COMMITTED).

    Does not promise: freedom from deadlocks with other statements of the same
    transaction that locked queue rows earlier (use :func:`defer_dagruns` for
    several assets in one transaction), or with transactions that lock these
    rows in another order. Retry the whole transaction on a deadlock
    (:func:`airflow_adrq.retry.run_in_transaction`).
    """
    merged = _merge(targets)
    if not merged:
        return
    dialect = bind.get_bind().dialect if isinstance(bind, Session) else bind.dialect
    targets_list = [QueueTarget(k, tuple(sorted(v))) for k, v in merged.items()]
    stmt = build_queue_statement(
        targets_list, dialect=dialect, created_at=created_at, on_conflict=on_conflict
    )
    bind.execute(stmt)


# --- commit-time queueing ---------------------------------------------------


@dataclass
class _Deferred:
    """One :func:`defer_dagruns` call."""

    targets: dict[int, set[str]]
    refresh: bool


def _queue_deferred(session: Session, entries: list[_Deferred]) -> None:
    queue_dagruns(
        session,
        [QueueTarget(k, tuple(v)) for entry in entries for k, v in entry.targets.items()],
        on_conflict="refresh" if any(entry.refresh for entry in entries) else "ignore",
    )


_DEFERRED: DeferredWrites[_Deferred] = DeferredWrites("deferred_dagruns", _queue_deferred)


def defer_dagruns(
    session: Session,
    targets: Iterable[QueueTarget | int],
    *,
    on_conflict: ConflictMode = "ignore",
) -> None:
    """Record ``targets`` to be queued by ONE statement just before COMMIT.

    Every asset deferred in the session's transaction is queued by a single
    :func:`build_queue_statement` run from the session's ``before_commit``
    hook, so all of a transaction's queue rows are locked in one global
    ``(asset_id, target_dag_id)`` order and only for the duration of the
    commit. ``on_conflict="refresh"`` for any target makes the whole
    statement refresh.

    Visibility: the rows do not exist until the commit (or an explicit
    :func:`flush_queue`); a query on ``asset_dag_run_queue`` in the same
    transaction does not see them. Rollback: nothing is queued. SAVEPOINTs:
    targets deferred inside a nested transaction that is rolled back are
    dropped; those of a released one are queued at the outermost COMMIT.

    Locks: none until the commit; then as :func:`queue_dagruns`. A failure of
    the statement (e.g. a deadlock) makes ``Session.commit()`` raise; the
    transaction is rolled back and nothing is queued: retry the whole
    transaction.
    """
    merged = _merge(targets)
    if merged:
        _DEFERRED.add(session, _Deferred(merged, refresh=on_conflict == "refresh"))


def pending_targets(session: Session) -> list[QueueTarget]:
    """Targets deferred in this session's open transaction and not queued yet, in queue order."""
    entries = _DEFERRED.pending(session)
    merged = _merge(QueueTarget(k, tuple(v)) for entry in entries for k, v in entry.targets.items())
    return [QueueTarget(asset_id, tuple(sorted(names))) for asset_id, names in sorted(merged.items())]


def flush_queue(session: Session) -> None:
    """Queue everything deferred so far in this session, now, in one statement.

    For callers that must read the queue before committing. The rows are
    written in the session's current (possibly nested) transaction; if that
    SAVEPOINT is rolled back, the surviving targets are queued again at
    commit. Later deferrals are queued by the next flush or at commit. Locks
    as :func:`queue_dagruns`, from now until the transaction ends.
    """
    _DEFERRED.flush(session)


def discard_pending(session: Session) -> None:
    """Forget everything deferred in this session without queueing it."""
    _DEFERRED.clear(session)
