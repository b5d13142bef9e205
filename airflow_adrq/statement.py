"""The statements every backend's queue write shares: built once per dialect and shape.

Driven by the transaction's own ``asset_event`` rows: ``ev`` (the events), ``src`` (their consumers over
the four kinds of reference: direct, by name, by URI, through the aliases the event was emitted
through), :func:`wanted` (the rows to queue: unpaused, not partitioned; multi-team: the allowed pairs),
and :func:`insert_of`, the ordered ``INSERT ... SELECT`` with the backend's conflict clause. Each
backend's writer (:mod:`airflow_adrq.dialects`) sends them in its own order; PostgreSQL's shows the
whole statement as it is sent.

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
* **Constant shape.** The only list parameters are the event ids (aliases come from the
  ``asset_alias_asset_event`` rows) and, multi-team, the allowed pairs: built and compiled once.
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

from sqlalchemy import ColumnElement, bindparam, or_, select, tuple_, union, update
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.selectable import CTE, Select

from airflow_adrq import dialects, tables
from airflow_adrq.dialects import ConflictMode
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.tables import UtcDateTime

__all__ = [
    "STAMP_EVENTS",
    "Form",
    "Source",
    "consumers",
    "consumers_of_events",
    "form_consumers",
    "insert_of",
    "insert_statement",
    "referencing_dags",
    "stamped_events",
    "wanted",
]

#: What drives the statement: a transaction's events (the default, with
#: aliases) or bare asset ids (direct, name and URI references only).
Source = Literal["events", "assets"]

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


def form_consumers(form: Form) -> Any:
    """:func:`_consumers_union` of ``form``'s source: with aliases and event ids where it needs them."""
    with_event_id = form.restricted or form.shape.event_keyed
    return _consumers_union(_source(form), with_aliases=form.source == "events", with_event_id=with_event_id)


def wanted(form: Form, src: Any = None) -> Select[Any]:
    """``SELECT asset_id, dag_id`` (3.4: ``, event_id``): the rows ``form``'s statement queues, unordered.

    ``src``: the consumers (default: :func:`form_consumers` as a subquery).
    """
    shape = form.shape
    if shape.event_keyed and form.source != "events":
        raise ValueError(f"{shape.name}'s queue is keyed by event: it can only be driven by events")
    if src is None:
        src = form_consumers(form).subquery("src")
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
    return insert_of(dialect_name, form, bindparam("created_at", type_=UtcDateTime()))


def insert_of(
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
