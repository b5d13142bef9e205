"""The statements that queue downstream DAG runs: built once per dialect and shape, executed by :mod:`.queue`.

Driven by the transaction's own ``asset_event`` rows. Where the scheduler locks the consumers' ``dag``
rows before it makes their runs, the whole queue write is one statement on PostgreSQL (MySQL 8 sends its
parts separately, in the same order; the conflict clause is per dialect)::

    WITH ev AS (                    -- this transaction's events
        SELECT e.id AS event_id, e.asset_id FROM asset_event e
         WHERE e.id IN (:ids) AND e.partition_key IS NULL
    ), src AS MATERIALIZED (        -- their consumers, read once: DAGs scheduled on the event's
        SELECT ev.asset_id, r.dag_id FROM ev     -- asset directly, by Asset.ref(name=...) and
          JOIN dag_schedule_asset_reference r    -- (uri=...), or on an alias it was emitted through
            ON r.asset_id = ev.asset_id
        UNION ... dag_schedule_asset_name_reference / _uri_reference (JOIN asset)
        UNION ... asset_alias_asset_event JOIN dag_schedule_asset_alias_reference
    ), locked AS MATERIALIZED (     -- every consumer's dag row, FOR SHARE, in byte order
        SELECT dag_id FROM dag
         WHERE dag_id = ANY (CAST((SELECT array_agg(dag_id) FROM src) AS VARCHAR[]))
         ORDER BY dag_id COLLATE "C" FOR SHARE OF dag NOWAIT
    ), stamp AS MATERIALIZED (      -- the database's clock, read once the locks are held
        SELECT clock_timestamp() AS stamp FROM (SELECT count(*) FROM locked) AS held
    ), queued AS (
        INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at)
        SELECT src.asset_id, src.dag_id, (SELECT stamp FROM stamp)
        FROM src JOIN dag ON dag.dag_id = src.dag_id      -- the same primary-key probe
        WHERE dag.dag_id = ANY (CAST((SELECT array_agg(dag_id) FROM src) AS VARCHAR[]))
          AND dag.is_paused = false AND dag.timetable_partitioned = false
        ORDER BY src.asset_id, src.dag_id
        ON CONFLICT (asset_id, target_dag_id) DO UPDATE
            SET created_at = greatest(asset_dag_run_queue.created_at, excluded.created_at)
            WHERE asset_dag_run_queue.created_at < excluded.created_at
        RETURNING asset_id
    )
    UPDATE asset_event SET timestamp = (SELECT stamp FROM stamp) WHERE id IN (:ids)
    RETURNING timestamp, (SELECT count(*) FROM queued)   -- rows inserted or moved forwards

Why this shape:

* **Lock order.** Rows are inserted, and so locked, in primary-key order as the database collates it
  (never a Python sort: collations differ from code-point order), so two transactions queueing
  overlapping rows wait in one order and cannot form a cycle on this table. ``ORDER BY`` is at the top
  level because MariaDB may ignore it in a derived table. Neither PostgreSQL nor MySQL documents that
  ``INSERT ... SELECT ... ORDER BY`` inserts in order, though both do; the concurrency tests fail if
  that changes.
* **One statement per transaction.** One statement per asset would still lock ``(A, d)`` and ``(B, d)``
  in opposite orders in two tasks with several outlets: :func:`defer_events` queues all of a
  transaction's events at once.
* **Constant shape.** The only parameters are the event ids (aliases come from the
  ``asset_alias_asset_event`` rows): built and compiled once.
* **Timing.** The events' ``timestamp`` and their rows' ``created_at`` are one value of the database's
  clock, read once the consumers' ``dag`` rows are share-locked (GUARANTEES.md, "Timing").
* **Same rows as Airflow 3.3.** Direct, alias, name and URI references; unpaused DAGs only; each (asset,
  DAG) once; partitioned DAGs and events with a ``partition_key`` go to Airflow's
  ``asset_partition_dag_run`` instead. Like Airflow, stale DAGs are queued and the scheduler filters
  them.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import ARRAY, ColumnElement, String, any_, bindparam, func, or_, select, tuple_, union, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.selectable import CTE, Select

from airflow_adrq import dialects, tables
from airflow_adrq.dialects import ConflictMode
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.tables import UtcDateTime

__all__ = [
    "ONE_DAG_SHARE_LOCK",
    "STAMP_EVENTS",
    "Form",
    "Source",
    "consumers",
    "consumers_of_events",
    "insert_statement",
    "referencing_dags",
    "share_lock",
    "stamped_events",
    "wanted",
    "write_once",
]

#: What drives the statement: a transaction's events (the default, with
#: aliases) or bare asset ids (direct, name and URI references only).
Source = Literal["events", "assets"]
_Wait = Literal["wait", "nowait", "skip_locked"]

_ADRQ = tables.asset_dag_run_queue
_ADRQ_BY_EVENT = tables.asset_dag_run_queue_by_event
_DAG = tables.dag
_EVENT = tables.asset_event


def _events_cte(ids: str = "ids", *, unkeyed_only: bool = False) -> CTE:
    """``ev``: the events bound to ``:<ids>`` (only those without a ``partition_key`` if asked)."""
    ev = select(_EVENT.c.id.label("event_id"), _EVENT.c.asset_id).where(
        _EVENT.c.id.in_(bindparam(ids, expanding=True))
    )
    if unkeyed_only:
        # Keyed events go to Airflow's partitioned path, never to this queue.
        ev = ev.where(_EVENT.c.partition_key.is_(None))
    return ev.cte("ev")


def consumers(ev: CTE, *, with_aliases: bool) -> Any:
    """``src``: the UNION of (asset_id, dag_id) of ``ev``'s assets over every kind of reference."""
    return _consumers_union(ev, with_aliases=with_aliases).subquery("src")


def _consumers_union(ev: CTE, *, with_aliases: bool, with_event_id: bool = False) -> Any:
    """The bare ``UNION`` of :func:`consumers`, led by ``event_id`` too if asked."""
    asset, direct = tables.asset, tables.dag_schedule_asset_reference
    by_name, by_uri = tables.dag_schedule_asset_name_reference, tables.dag_schedule_asset_uri_reference
    key = [ev.c.event_id, ev.c.asset_id] if with_event_id else [ev.c.asset_id]
    parts = [
        select(*key, direct.c.dag_id).join(direct, direct.c.asset_id == ev.c.asset_id),
        select(*key, by_name.c.dag_id)
        .join(asset, asset.c.id == ev.c.asset_id)
        .join(by_name, by_name.c.name == asset.c.name),
        select(*key, by_uri.c.dag_id)
        .join(asset, asset.c.id == ev.c.asset_id)
        .join(by_uri, by_uri.c.uri == asset.c.uri),
    ]
    if with_aliases:
        link, by_alias = tables.asset_alias_asset_event, tables.dag_schedule_asset_alias_reference
        parts.append(
            select(*key, by_alias.c.dag_id)
            .join(link, link.c.event_id == ev.c.event_id)
            .join(by_alias, by_alias.c.alias_id == link.c.alias_id)
        )
    return union(*parts)


@dataclass(frozen=True)
class Form:
    """Which variant of the statement to build: everything but the dialect."""

    source: Source
    on_conflict: ConflictMode
    shape: QueueShape = PARTITIONED
    #: Multi-team: events in ``:restricted_ids`` queue only their ``:allowed`` pairs.
    restricted: bool = False


@functools.cache
def _source(form: Form) -> CTE:
    """The ``ev`` CTE ``form``'s statements read: one object, so a statement using it twice has it once."""
    if form.source == "assets":
        ids = tables.asset.c.id
        return select(ids.label("asset_id")).where(ids.in_(bindparam("ids", expanding=True))).cte("ev")
    return _events_cte(unkeyed_only=form.shape.partitions)


def _form_consumers(form: Form) -> Any:
    """:func:`_consumers_union` of ``form``'s source: with aliases and event ids where it needs them."""
    with_event_id = form.restricted or form.shape.event_keyed
    return _consumers_union(_source(form), with_aliases=form.source == "events", with_event_id=with_event_id)


def wanted(form: Form, src: Any = None) -> Select[Any]:
    """``SELECT asset_id, dag_id`` (3.4: ``, event_id``): the rows ``form``'s statement queues, unordered.

    ``src``: the consumers (default: :func:`_form_consumers` as a subquery).
    """
    shape = form.shape
    if shape.event_keyed and form.source != "events":
        raise ValueError(f"{shape.name}'s queue is keyed by event: it can only be driven by events")
    if src is None:
        src = _form_consumers(form).subquery("src")
    picked = [src.c.asset_id, src.c.dag_id, *([src.c.event_id] if shape.event_keyed else [])]
    rows = select(*picked).join(_DAG, _DAG.c.dag_id == src.c.dag_id).where(*shape.consumer_filter(_DAG.c))
    if form.restricted:
        # Events listed in :restricted_ids queue only their (event_id, dag_id)
        # pairs in :allowed (Airflow's multi-team filter, computed by the
        # caller); the others queue every consumer. One row per (asset, DAG).
        allowed = tuple_(src.c.event_id, src.c.dag_id).in_(bindparam("allowed", expanding=True))
        unrestricted = src.c.event_id.not_in(bindparam("restricted_ids", expanding=True))
        rows = rows.where(or_(unrestricted, allowed)).distinct()
    return rows


@functools.cache
def insert_statement(dialect_name: str, form: Form) -> Insert:
    """The ordered ``INSERT ... SELECT`` with ``created_at`` bound (``:created_at``)."""
    return _insert(dialect_name, form, bindparam("created_at", type_=UtcDateTime()))


def _insert(
    dialect_name: str, form: Form, created_at: ColumnElement[dt.datetime], picked: Select[Any] | None = None
) -> Insert:
    """The ``INSERT ... SELECT`` of ``picked`` (default: :func:`wanted`) in the queue's key order."""
    on_conflict, shape = form.on_conflict, form.shape
    rows = (wanted(form) if picked is None else picked).add_columns(created_at)
    src = rows.selected_columns
    target: Any
    if shape.event_keyed:
        # One row per (consumer, event), in the queue's key order. No row is
        # shared between events, so there is nothing to refresh: a conflict
        # could only be the same event queued twice.
        on_conflict = "ignore"
        target = _ADRQ_BY_EVENT
        columns = [target.c.asset_id, target.c.target_dag_id, target.c.asset_event_id, target.c.created_at]
        order = [src.dag_id, src.event_id]
    else:
        target = _ADRQ
        columns = [target.c.asset_id, target.c.target_dag_id, target.c.created_at]
        order = [src.asset_id, src.dag_id]
    return dialects.get(dialect_name).insert_from_select(
        target, columns, rows.order_by(*order), shape.queue_key, on_conflict, "created_at"
    )


@functools.cache
def consumers_of_events() -> Select[Any]:
    """``SELECT asset_id, dag_id`` of every DAG referencing the ``:event_ids`` events' assets; locks nothing.

    The four kinds of reference without the ``dag`` filter: for callers that route some consumers in
    Python (Airflow's partitioned DAGs, its multi-team filter) and add their own filters.
    """
    src = consumers(_events_cte("event_ids"), with_aliases=True)
    return select(src.c.asset_id, src.c.dag_id)


def stamped_events(stamp: Any) -> Update:
    """``UPDATE asset_event SET timestamp = <stamp> WHERE id IN (:ids)``."""
    return update(_EVENT).where(_EVENT.c.id.in_(bindparam("ids", expanding=True))).values(timestamp=stamp)


STAMP_EVENTS: Update = stamped_events(bindparam("stamp", type_=UtcDateTime()))


def referencing_dags(form: Form) -> Select[Any]:
    """``SELECT dag_id`` of every DAG scheduled on the events' assets or aliases, paused or not.

    Wider than the statement's consumers: a DAG unpaused in between would be queued unlocked.
    """
    return select(consumers(_source(form), with_aliases=form.source == "events").c.dag_id)


@functools.cache
def share_lock(dialect_name: str, form: Form, wait: _Wait = "wait") -> Select[Any]:
    """``SELECT dag_id FROM dag WHERE <in consumers> ORDER BY <lock order> FOR SHARE``.

    ``<in consumers>``: ``IN (:dag_ids)`` where the backend locks by id list, else
    ``= ANY(<array of the consumers>)``. ``wait``: block, fail at once (``NOWAIT``) or leave the row out
    (``SKIP LOCKED``).
    """
    in_consumers: ColumnElement[bool]
    if dialects.get(dialect_name).lock_by_id_list:
        in_consumers = _DAG.c.dag_id.in_(bindparam("dag_ids", expanding=True))
    else:
        in_consumers = _in_consumers(_form_consumers(form).subquery("src"))
    return _locking_read(dialect_name, in_consumers, wait)


def _in_consumers(src: Any) -> ColumnElement[bool]:
    """``dag.dag_id = ANY((SELECT array_agg(dag_id) FROM src))`` (PostgreSQL).

    One array, so PostgreSQL probes ``dag``'s primary key once per consumer. ``dag_id IN (<subquery>)``
    is planned as a join, and the planner, which cannot know the events' assets, estimates the average
    fan-out: with a few thousand DAGs it hashes all of ``dag`` (a sequential scan) for an event with one
    consumer.
    """
    # The CAST makes the subquery one value (an array), not ANY's row source.
    consumers = sql_cast(select(func.array_agg(src.c.dag_id)).scalar_subquery(), ARRAY(String))
    return _DAG.c.dag_id == any_(consumers)


def _locking_read(dialect_name: str, in_consumers: ColumnElement[bool], wait: _Wait) -> Select[Any]:
    """The consumers' ``dag`` rows, ``FOR SHARE`` in the backend's lock order."""
    lock_order = dialects.get(dialect_name).lock_order
    assert lock_order is not None
    return (
        select(_DAG.c.dag_id)
        .where(in_consumers)
        .order_by(lock_order(_DAG.c.dag_id))
        .with_for_update(read=True, of=_DAG, nowait=wait == "nowait", skip_locked=wait == "skip_locked")
    )


#: ``SELECT dag_id FROM dag WHERE dag_id = :dag_id FOR SHARE OF dag``: waits for one row's holder.
ONE_DAG_SHARE_LOCK = (
    select(_DAG.c.dag_id).where(_DAG.c.dag_id == bindparam("dag_id")).with_for_update(read=True, of=_DAG)
)


@functools.cache
def write_once(dialect_name: str, form: Form) -> Update:
    """The whole queue write as ONE statement (PostgreSQL; the SQL is in the module docstring).

    ``stamp`` is read only after ``count(*)`` has read (so locked) every consumer row. The INSERT reads
    the consumers' ``dag`` columns by the same primary-key probe as the lock (``= ANY(<array>)``), never
    by joining the two CTEs: PostgreSQL has no statistics for a CTE and plans that join from the average
    fan-out, and with a small average a popular asset's join became a nested loop over both (1,024
    consumers: a million comparisons, 230 ms of a 290 ms statement).
    """
    clock_after_locks = dialects.get(dialect_name).clock_after_locks
    assert clock_after_locks is not None
    src = _form_consumers(form).cte("src").prefix_with("MATERIALIZED")
    locked = (
        _locking_read(dialect_name, _in_consumers(src), "nowait").cte("locked").prefix_with("MATERIALIZED")
    )
    held = select(func.count().label("rows")).select_from(locked).subquery("held")
    stamp = (
        select(clock_after_locks().label("stamp")).select_from(held).cte("stamp").prefix_with("MATERIALIZED")
    )
    rows = wanted(form, src).where(_in_consumers(src))
    now = select(stamp.c.stamp).scalar_subquery()
    written = _insert(dialect_name, form, now, rows)
    queued = written.returning(written.table.c.asset_id).cte("queued")
    # RETURNING, per event: the stamp, and the queue rows inserted or moved forwards (one count).
    count = select(func.count()).select_from(queued).scalar_subquery()
    return stamped_events(now).returning(_EVENT.c.timestamp, count).add_cte(src, locked, stamp, queued)
