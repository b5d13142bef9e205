"""Queue downstream DAG runs with ONE ordered, set-based statement per transaction.

The statement is driven by the transaction's own ``asset_event`` rows. Where
Airflow's scheduler locks the consumers' ``dag`` rows before it makes their
runs (PostgreSQL; MySQL 8), the whole queue write is one statement on
PostgreSQL (the conflict clause is per dialect; MySQL 8 sends its parts as
separate statements, in the same order)::

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
    )
    UPDATE asset_event SET timestamp = (SELECT stamp FROM stamp) WHERE id IN (:ids)
    RETURNING timestamp

Each queue row is written once, with the stamp. A scheduler skips a DAG
whose ``dag`` row a producer holds ``FOR SHARE`` (its ``FOR NO KEY UPDATE
SKIP LOCKED``), so no run is made over a window holding an event that is
stamped and not yet visible; a producer that meets a scheduler holding the
row waits for its COMMIT and is stamped after it. The share locks never wait
while held (``NOWAIT`` under a SAVEPOINT, then a wait for the busy row alone:
:func:`_write_once_without_waiting_while_holding`), since Airflow's other
writers of ``dag`` lock rows in orders of their own.

Where the scheduler takes no row locks (MariaDB; ``[scheduler]
use_row_level_locking = False``) a ``dag`` lock orders nothing: the rows are
inserted with ``created_at =`` :data:`~airflow_adrq.refresh.PENDING`, then one clock reading goes
on the events and those rows (:func:`airflow_adrq.refresh.write_then_stamp`), and existing rows
are moved forwards after COMMIT (:mod:`airflow_adrq.refresh`).

The route from the entry point to that SQL, the one place it is written down:

1. ``register_asset_change`` (:mod:`airflow_adrq.manager`, or the plug-in's
   ``AdrqAssetManager.register_asset_change``) flushes the ``asset_event``
   row and calls :func:`defer_events`, which records it on the session
   (``_DEFERRED``, a :class:`~airflow_adrq.txscope.DeferredWrites`). No SQL.
2. ``Session.commit()`` fires the ``before_commit`` listener that
   :mod:`airflow_adrq.txscope` installs on the ``Session`` class the first
   time an event is deferred; it runs ``DeferredWrites._before_commit``: a
   final flush, then one :func:`_queue_deferred` call with every event
   still alive in the transaction (rolled-back SAVEPOINTs' events dropped).
3. :func:`_queue_deferred` writes the alias rows
   (:func:`airflow_adrq.aliases.write_alias_rows`), then calls
   :func:`queue_events` once: with the scheduler's ``dag`` lock,
   :func:`_lock_stamp_write` (:func:`_write_once` on PostgreSQL; the share
   lock, the clock, the events and the rows as four statements on MySQL 8;
   no lock on SQLite, whose writers take turns); without it,
   :func:`airflow_adrq.refresh.write_then_stamp`.
   Keyed events are filtered in ``_events_cte``, partitioned and paused DAGs
   by the shape's ``consumer_filter``. Then the COMMIT itself.
4. With ``on_conflict="refresh_after_commit"``, :mod:`airflow_adrq.refresh`
   reads the pairs whose row is older than the stamp, still before COMMIT;
   if there are any, it moves those no one holds forwards (``SKIP
   LOCKED``) as the transaction's last statements, and the ``after_commit``
   listener the others, on the same connection. The module is loaded the
   first time a transaction uses that policy: by default on MariaDB, and on
   any backend with ``[scheduler] use_row_level_locking = False``.

Why this shape:

* **Lock order.** Rows are inserted, and so locked, in primary-key order as
  the database collates it (never a Python sort: collations differ from
  code-point order), so two transactions queueing overlapping rows wait in
  one order and cannot form a cycle on this table. ``ORDER BY`` is at the top
  level because MariaDB may ignore it in a derived table. Neither PostgreSQL
  nor MySQL documents that ``INSERT ... SELECT ... ORDER BY`` inserts in
  order, though both do; the concurrency tests fail if that changes.
* **One statement per transaction.** A task with several outlets registers
  each asset separately; one statement per asset would still lock ``(A, d)``
  and ``(B, d)`` in opposite orders in two such tasks. :func:`defer_events`
  queues all of a transaction's events in one statement just before COMMIT,
  which also holds the queue rows only for the commit.
* **Constant shape.** The only parameters are the event ids; aliases come
  from the ``asset_alias_asset_event`` rows the transaction wrote. Built and
  compiled once per dialect.
* **Timing.** The events' ``timestamp`` and their rows' ``created_at`` are one
  value of the database's clock, read just before COMMIT once the consumers'
  ``dag`` rows are share-locked (without that lock: once every queue row is
  locked), and an existing row moves forwards to it (``on_conflict``; where
  the scheduler locks no rows, after COMMIT: :mod:`airflow_adrq.refresh`);
  why, in the README's "Timing: which events a run consumes".
* **Same rows as Airflow 3.3.** Direct, alias, name and URI references;
  unpaused DAGs only; each (asset, DAG) once; partitioned DAGs and events
  with a ``partition_key`` go to Airflow's ``asset_partition_dag_run``
  instead. Like Airflow, stale DAGs are queued and the scheduler filters
  them.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    String,
    any_,
    bindparam,
    func,
    or_,
    select,
    tuple_,
    union,
    update,
)
from sqlalchemy import (
    cast as sql_cast,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, attributes
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.selectable import CTE, Select

from airflow_adrq import dialects, tables
from airflow_adrq.aliases import AliasedEvent, write_alias_rows
from airflow_adrq.dialects import ConflictMode, ConflictPolicy, ResolvedPolicy
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.tables import UtcDateTime, utcnow
from airflow_adrq.txscope import DeferredWrites

__all__ = [
    "IDS_PER_STATEMENT",
    "EventLike",
    "Source",
    "check_one_policy",
    "consumers_of_events",
    "defer_events",
    "flush_queue",
    "in_schema",
    "pending_events",
    "queue_events",
]

#: Ids bound to one statement, below SQLite's 32,766 and psycopg 3's 65,535
#: bound-parameter limits. Larger sets: several statements (:func:`_chunks`).
IDS_PER_STATEMENT = 30_000


#: Where the commit-time write reports ``(kind, name, value)``: ``"timing"`` (ms) or ``"incr"``. The
#: plug-in sends them to Airflow's ``Stats`` under ``adrq.`` (README, "Metrics"); by default nowhere.
def report(kind: str, name: str, value: float) -> None: ...  # replaced by the plug-in


#: What drives the statement: a transaction's events (the default, with
#: aliases) or bare asset ids (direct, name and URI references only).
Source = Literal["events", "assets"]

_ADRQ = tables.asset_dag_run_queue
_EVENT = tables.asset_event


class EventLike(Protocol):
    """An ``asset_event`` row: ours, Airflow's ORM ``AssetEvent``, or a plain record."""

    @property
    def id(self) -> int: ...

    @property
    def asset_id(self) -> int: ...


# --- the statement ----------------------------------------------------------


def _events_cte(shape: QueueShape) -> CTE:
    ev = select(_EVENT.c.id.label("event_id"), _EVENT.c.asset_id).where(
        _EVENT.c.id.in_(bindparam("ids", expanding=True))
    )
    if shape.partitions:
        # Keyed events go to Airflow's partitioned path, never to this queue.
        ev = ev.where(_EVENT.c.partition_key.is_(None))
    return ev.cte("ev")


def _assets_cte() -> CTE:
    asset = tables.asset
    return (
        select(asset.c.id.label("asset_id")).where(asset.c.id.in_(bindparam("ids", expanding=True))).cte("ev")
    )


def _consumers(ev: CTE, *, with_aliases: bool, with_event_id: bool = False) -> Any:
    """UNION of (asset_id, dag_id) -- or (event_id, asset_id, dag_id) -- over every kind of reference.

    A subquery named ``src``; :func:`_consumers_union` for the bare ``UNION``.
    """
    return _consumers_union(ev, with_aliases=with_aliases, with_event_id=with_event_id).subquery("src")


def _consumers_union(ev: CTE, *, with_aliases: bool, with_event_id: bool = False) -> Any:
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


_DAG = tables.dag
_ADRQ_BY_EVENT = tables.asset_dag_run_queue_by_event


@dataclass(frozen=True)
class _Form:
    """Which variant of the statement to build: everything but the dialect."""

    source: Source
    on_conflict: ConflictMode
    shape: QueueShape = PARTITIONED
    #: Multi-team: events in ``:restricted_ids`` queue only their ``:allowed`` pairs.
    restricted: bool = False


@functools.cache
def _source(form: _Form) -> CTE:
    """The ``ev`` CTE ``form``'s statements read: one object, so a statement using it twice has it once."""
    return _events_cte(form.shape) if form.source == "events" else _assets_cte()


def _form_consumers(form: _Form) -> Any:
    """:func:`_consumers_union` of ``form``'s source: with aliases and event ids where it needs them."""
    with_event_id = form.restricted or form.shape.event_keyed
    return _consumers_union(_source(form), with_aliases=form.source == "events", with_event_id=with_event_id)


def _wanted(form: _Form, src: Any = None, dag: Any = _DAG) -> Select[Any]:
    """``SELECT asset_id, dag_id`` (3.4: ``, event_id``): the rows ``form``'s statement queues, unordered.

    ``src``: the consumers (default: :func:`_form_consumers` as a subquery);
    ``dag``: where the consumers' ``dag`` columns are read (default: the table).
    """
    source, shape, restricted = form.source, form.shape, form.restricted
    if shape.event_keyed and source != "events":
        raise ValueError(f"{shape.name}'s queue is keyed by event: it can only be driven by events")
    if src is None:
        src = _form_consumers(form).subquery("src")
    picked = [src.c.asset_id, src.c.dag_id, *([src.c.event_id] if shape.event_keyed else [])]
    rows = select(*picked).join(dag, dag.c.dag_id == src.c.dag_id).where(*shape.consumer_filter(dag.c))
    if restricted:
        # Events listed in :restricted_ids queue only their (event_id, dag_id)
        # pairs in :allowed (Airflow's multi-team filter, computed by the
        # caller); the others queue every consumer. One row per (asset, DAG).
        allowed = tuple_(src.c.event_id, src.c.dag_id).in_(bindparam("allowed", expanding=True))
        unrestricted = src.c.event_id.not_in(bindparam("restricted_ids", expanding=True))
        rows = rows.where(or_(unrestricted, allowed)).distinct()
    return rows


@functools.cache
def _statement(dialect_name: str, form: _Form) -> Insert:
    """The ordered ``INSERT ... SELECT`` with ``created_at`` bound (``:created_at``)."""
    return _insert(dialect_name, form, bindparam("created_at", type_=UtcDateTime()))


def _insert(
    dialect_name: str, form: _Form, created_at: ColumnElement[dt.datetime], wanted: Select[Any] | None = None
) -> Insert:
    on_conflict, shape = form.on_conflict, form.shape
    rows = (_wanted(form) if wanted is None else wanted).add_columns(created_at)
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
    """``SELECT asset_id, dag_id`` of every DAG referencing some events' assets; bind ``event_ids``.

    The statement's four kinds of reference, before its ``dag`` filter: for
    callers that treat some consumers in Python (Airflow's partitioned DAGs,
    its multi-team filter) and add their own filters. Locks nothing.
    """
    ev = (
        select(_EVENT.c.id.label("event_id"), _EVENT.c.asset_id)
        .where(_EVENT.c.id.in_(bindparam("event_ids", expanding=True)))
        .cte("ev")
    )
    src = _consumers(ev, with_aliases=True)
    return select(src.c.asset_id, src.c.dag_id)


def _stamped_events(stamp: Any) -> Update:
    return update(_EVENT).where(_EVENT.c.id.in_(bindparam("ids", expanding=True))).values(timestamp=stamp)


_STAMP_EVENTS: Update = _stamped_events(bindparam("stamp", type_=UtcDateTime()))


def clock_on_events(conn: Connection, ids: list[int], options: Mapping[str, Any]) -> dt.datetime:
    """One reading of the database's clock (SQLite: Python's), put on the events ``ids``; returns it."""
    clock = dialects.get(conn).clock
    stamp = conn.execute(select(clock())).scalar_one() if clock is not None else utcnow()
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        chunk = ids[start : start + IDS_PER_STATEMENT]
        conn.execute(_STAMP_EVENTS, {"ids": chunk, "stamp": stamp}, execution_options=options)
    return stamp


# --- the share lock and the one write -----------------------------------------


def _referencing_dags(form: _Form) -> Select[Any]:
    """``SELECT dag_id`` of every DAG scheduled on the events' assets or aliases, paused or not.

    Wider than the statement's consumers: a DAG unpaused in between would be queued unlocked.
    """
    return select(_consumers(_source(form), with_aliases=form.source == "events").c.dag_id)


_Wait = Literal["wait", "nowait", "skip_locked"]


@functools.cache
def _share_lock(dialect_name: str, form: _Form, wait: _Wait = "wait") -> Select[Any]:
    """``SELECT dag_id, <filter columns> FROM dag WHERE <in consumers> ORDER BY <lock order> FOR SHARE``.

    ``<in consumers>``: ``IN (:dag_ids)`` where the backend locks by id list
    (``lock_by_id_list``), else ``= ANY(<array of the consumers>)``
    (:func:`_locking_read`). ``wait``: block, fail at once (``NOWAIT``) or
    leave the row out (``SKIP LOCKED``).
    """
    support = dialects.get(dialect_name)
    if support.lock_by_id_list:
        by_id = _DAG.c.dag_id.in_(bindparam("dag_ids", expanding=True))
        return _locking_read(dialect_name, form, by_id, wait)
    return _locking_read(dialect_name, form, _in_consumers(_form_consumers(form).subquery("src")), wait)


def _in_consumers(src: Any) -> ColumnElement[bool]:
    """``dag.dag_id = ANY((SELECT array_agg(dag_id) FROM src))`` (PostgreSQL).

    One array, so PostgreSQL probes ``dag``'s primary key once per consumer.
    ``dag_id IN (<subquery>)`` is planned as a join, and the planner, which
    cannot know the events' assets, estimates the average fan-out: with a
    few thousand DAGs it hashes all of ``dag`` (a sequential scan) for an
    event with one consumer.
    """
    # The CAST makes the subquery one value (an array), not ANY's row source.
    consumers = sql_cast(select(func.array_agg(src.c.dag_id)).scalar_subquery(), ARRAY(String))
    return _DAG.c.dag_id == any_(consumers)


def _locking_read(dialect_name: str, form: _Form, consumers: ColumnElement[bool], wait: _Wait) -> Select[Any]:
    support = dialects.get(dialect_name)
    assert support.lock_order is not None
    return (
        select(_DAG.c.dag_id)
        .where(consumers)
        .order_by(support.lock_order(_DAG.c.dag_id))
        .with_for_update(read=True, of=_DAG, nowait=wait == "nowait", skip_locked=wait == "skip_locked")
    )


#: ``SELECT dag_id FROM dag WHERE dag_id = :dag_id FOR SHARE OF dag``: waits for one row's holder.
_ONE_DAG_SHARE_LOCK = (
    select(_DAG.c.dag_id).where(_DAG.c.dag_id == bindparam("dag_id")).with_for_update(read=True, of=_DAG)
)


@functools.cache
def _write_once(dialect_name: str, form: _Form) -> Update:
    """The whole queue write as ONE statement (PostgreSQL; the SQL is in the module docstring).

    The consumers (``src``) are read once; ``locked`` share-locks their
    ``dag`` rows. ``stamp`` is computed once, and only after ``count(*)`` has
    read (so locked) every consumer row: the clock is read once the share
    locks are held, however long they took. Each queue row is written once,
    with it. The INSERT reads the consumers' ``dag`` columns by the same
    primary-key probe as the lock (``= ANY(<array>)``), never by joining the
    two CTEs: PostgreSQL has no statistics for a CTE and plans that join from
    the average fan-out, and with a small average a popular asset's join
    became a nested loop over both (1,024 consumers: a million comparisons,
    230 ms of a 290 ms statement).
    """
    support = dialects.get(dialect_name)
    assert support.clock_after_locks is not None
    src = _form_consumers(form).cte("src").prefix_with("MATERIALIZED")
    locking = _locking_read(dialect_name, form, _in_consumers(src), "nowait")
    locked = locking.cte("locked").prefix_with("MATERIALIZED")
    held = select(func.count().label("rows")).select_from(locked).subquery("held")
    stamp = (
        select(support.clock_after_locks().label("stamp"))
        .select_from(held)
        .cte("stamp")
        .prefix_with("MATERIALIZED")
    )
    wanted = _wanted(form, src).where(_in_consumers(src))
    queued = _insert(dialect_name, form, select(stamp.c.stamp).scalar_subquery(), wanted).cte("queued")
    return (
        update(_EVENT)
        .where(_EVENT.c.id.in_(bindparam("ids", expanding=True)))
        .values(timestamp=select(stamp.c.stamp).scalar_subquery())
        .returning(_EVENT.c.timestamp)
        .add_cte(src, locked, stamp, queued)
    )


#: Times :func:`_write_once_without_waiting_while_holding` waits for a busy ``dag`` row
#: (holding none) before it takes the rest in order, waiting while it holds.
WAITS_WITHOUT_HOLDING = 20

_SAVEPOINT = "adrq_share_lock"


def _write_once_without_waiting_while_holding(
    conn: Connection, form: _Form, params: dict[str, Any], options: Mapping[str, Any]
) -> dt.datetime:
    r""":func:`_write_once` with ``NOWAIT``; while a consumer's ``dag`` row is busy, wait for it holding none.

    Airflow's writers of ``dag`` lock rows in orders of their own (the DAG
    processor's ``SELECT ... FOR NO KEY UPDATE`` and bulk ``UPDATE``\ s in plan
    order, its ORM flushes in Python's), so no order of ours matches them
    all. On 55P03 it rolls back to the SAVEPOINT (PostgreSQL then releases
    the row locks taken after it), waits for each busy row alone, and tries
    again; after :data:`WAITS_WITHOUT_HOLDING` rounds it waits in order.
    """
    support = dialects.get(conn)
    conn.exec_driver_sql(f"SAVEPOINT {_SAVEPOINT}")
    for _ in range(WAITS_WITHOUT_HOLDING):
        try:
            result = conn.execute(_write_once(support.name, form), params, execution_options=options)
        except DBAPIError as exc:
            if not support.lock_not_available(exc):
                raise
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            _wait_for_busy_rows(conn, form, params, options)
            continue
        return cast(dt.datetime, result.scalar())  # RETURNING: a row per event, one value
    conn.execute(_share_lock(support.name, form), params, execution_options=options)
    return cast(
        dt.datetime, conn.execute(_write_once(support.name, form), params, execution_options=options).scalar()
    )


def _wait_for_busy_rows(
    conn: Connection, form: _Form, params: dict[str, Any], options: Mapping[str, Any]
) -> None:
    """Wait, holding no ``dag`` row of ours, until each busy consumer row was released once.

    The last one stays locked: a scheduler's next pass would take it again before the retry.
    """
    support = dialects.get(conn)
    wanted = set(conn.execute(_referencing_dags(form), params, execution_options=options).scalars())
    free = conn.execute(_share_lock(support.name, form, "skip_locked"), params, execution_options=options)
    busy = sorted(wanted - set(free.scalars()))
    conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    for n, dag_id in enumerate(busy, 1):
        conn.execute(_ONE_DAG_SHARE_LOCK, {"dag_id": dag_id}, execution_options=options)
        if n < len(busy):
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")


def _lock_stamp_write(
    conn: Connection, form: _Form, chunk_params: list[dict[str, Any]], options: Mapping[str, Any]
) -> dt.datetime:
    """Share-lock the consumers' ``dag`` rows, then read the clock, then write events and rows with it."""
    support = dialects.get(conn)
    lock = support.lock_order is not None and not form.shape.event_keyed
    # One statement binds the ids twice (and the multi-team pairs): within the limits?
    (one, *more) = chunk_params
    bound = 2 * len(one["ids"]) + len(one.get("restricted_ids", ())) + 2 * len(one.get("allowed", ()))
    if lock and support.clock_after_locks is not None and not more and bound <= IDS_PER_STATEMENT:
        return _write_once_without_waiting_while_holding(conn, form, one, options)
    if lock:
        for params in chunk_params:
            if support.lock_by_id_list:
                found = conn.execute(_referencing_dags(form), params, execution_options=options)
                params = {"dag_ids": sorted(set(found.scalars()))}
                if not params["dag_ids"]:
                    continue
            conn.execute(_share_lock(support.name, form), params, execution_options=options)
    stamp = clock_on_events(conn, [event_id for p in chunk_params for event_id in p["ids"]], options)
    stmt = _statement(support.name, form)
    for params in chunk_params:
        conn.execute(stmt, {**params, "created_at": stamp}, execution_options=options)
    return stamp


def _connection(bind: Session | Connection) -> Connection:
    return bind.connection() if isinstance(bind, Session) else bind


def _chunks(events: Iterable[EventLike]) -> Iterator[list[int]]:
    """Event ids in ``(asset_id, id)`` order, cut only between assets (3.3's key leads with the asset)."""
    # (And an asset's rows must come from one statement: which alias rows it
    # reads depends on which events are in it.)
    chunk: list[int] = []
    last_asset: int | None = None
    seen: set[int] = set()
    for event in sorted(events, key=lambda e: (e.asset_id, e.id)):
        if event.id in seen:
            continue
        seen.add(event.id)
        if len(chunk) >= IDS_PER_STATEMENT and event.asset_id != last_asset:
            yield chunk
            chunk = []
        chunk.append(event.id)
        last_asset = event.asset_id
    if chunk:
        yield chunk


def queue_events(
    bind: Session | Connection,
    events: Iterable[EventLike],
    *,
    on_conflict: ConflictPolicy = "auto",
    allowed: Mapping[int, Iterable[str]] | None = None,
    shape: QueueShape = PARTITIONED,
    schema: str | None = None,
) -> dt.datetime | None:
    """Queue the consumers of ``events`` now and stamp them; return the stamp.

    In the caller's transaction, without committing. With ``"refresh"`` or
    ``"ignore"`` (``"auto"`` where the scheduler locks rows), three steps:

    1. **Share-lock** every consumer's ``dag`` row (paused or not, every kind
       of reference; 3.4's per-event queue needs none), in byte order. This
       is where it may wait: for a scheduler creating those DAGs' runs, the
       DAG processor saving them, a pause. PostgreSQL never waits while it
       holds one (``NOWAIT`` under a SAVEPOINT, then a wait for the busy row
       alone); MySQL 8 waits in primary-key order.
    2. **Stamp.** Then the database's clock (``clock_timestamp()`` once the
       locks are held, ``UTC_TIMESTAMP(6)``; SQLite: Python's, one host).
    3. **Write** the events' ``timestamp`` and the queue rows with it, each
       row once, by ONE ordered ``INSERT ... SELECT`` (past
       :data:`IDS_PER_STATEMENT` events, several); it may wait for producers
       inserting the same rows. PostgreSQL: steps 1-3 are one statement.

    A scheduler skips a DAG whose ``dag`` row is share-locked, so no run is
    made while an event of it is stamped and not yet visible, whichever
    asset it is of. With ``"refresh_after_commit"`` (``"auto"`` where the
    scheduler takes no row locks) there is no such lock to order by: the
    rows are written at :data:`PENDING` first, then stamped once they are
    all locked, so that producers sharing a row are stamped in commit order.
    Why that matters, and what is left: the README's "Timing". Pass only the
    caller's own uncommitted events; the caller should COMMIT next, as the
    commit-time write does. No events: does nothing and returns ``None``.

    ``on_conflict``: ``"refresh"`` gives an existing row the stamp, ``"ignore"``
    leaves it, ``"refresh_after_commit"`` moves it forwards without waiting for
    it: now if no one holds it, else after the Session's COMMIT
    (:mod:`airflow_adrq.refresh`; a bare Connection: ``"ignore"``),
    ``"auto"``: :func:`airflow_adrq.dialects.resolve`. ``allowed``: event id ->
    the only DAG ids it may queue (multi-team). ``shape``:
    :mod:`airflow_adrq.shapes`; ``schema``: ``[database] sql_alchemy_schema``.

    Locks, until the transaction ends: the consumers' ``dag`` rows ``FOR
    SHARE`` (not with ``"refresh_after_commit"``); the queue rows it inserts
    and, with ``"refresh"``, the existing ones, in ``(asset_id,
    target_dag_id)`` order (3.4: ``(target_dag_id, asset_event_id)``); on
    MySQL/MariaDB existing rows that need no write are skipped by a
    lock-free ``NOT EXISTS`` probe; the given ``asset_event`` rows (the
    caller's own). FK checks share-lock the ``asset`` and ``dag`` parents
    (PostgreSQL ``FOR KEY SHARE``). Reads the reference tables, ``asset``
    and ``asset_alias_asset_event`` without locks (READ COMMITTED;
    MySQL/MariaDB refuse other levels: :mod:`airflow_adrq.dialects.mysql`).

    Does not promise: no deadlock with earlier statements of the same
    transaction that locked queue or ``dag`` rows (use :func:`defer_events`),
    or, on MySQL 8, with a ``dag`` writer locking several of these rows against
    primary-key order (retry the whole transaction:
    :func:`airflow_adrq.retry.run_in_transaction`). A popular consumer is
    skipped by the scheduler while any producer holds its lock.
    """
    events = list(events)
    chunks = list(_chunks(events))
    if not chunks:
        return None
    conn = _connection(bind)
    support = dialects.get(conn)
    support.check_connection(conn)
    mode = dialects.resolve(on_conflict, conn)
    restricted = allowed is not None and bool(allowed)
    form = _Form("events", _in_statement(mode), shape, restricted)
    options = in_schema(schema)
    chunk_params: list[dict[str, Any]] = []
    for ids in chunks:
        params: dict[str, Any] = {"ids": ids}
        if allowed:
            mine = [event_id for event_id in ids if event_id in allowed]
            params["restricted_ids"] = mine
            params["allowed"] = [(event_id, dag_id) for event_id in mine for dag_id in allowed[event_id]]
        chunk_params.append(params)
    if mode == "refresh_after_commit":
        # Imported here: only where the scheduler locks no rows (MariaDB); elsewhere
        # no Airflow process loads it.
        from airflow_adrq import refresh

        asset_ids = sorted({event.asset_id for event in events})
        stamp = refresh.write_then_stamp(conn, form, chunk_params, asset_ids, options)
    else:
        stamp = _lock_stamp_write(conn, form, chunk_params, options)
    for event in events:
        if _is_mapped(event):
            _set_loaded_timestamp(event, stamp)
    if mode == "refresh_after_commit" and not shape.event_keyed and isinstance(bind, Session):
        refresh.plan(bind, conn, form, chunk_params, stamp, options)
    return stamp


def _in_statement(mode: ResolvedPolicy) -> ConflictMode:
    """What the statement itself does with an existing row (a refresh after COMMIT leaves it here)."""
    return "refresh" if mode == "refresh" else "ignore"


def in_schema(schema: str | None) -> dict[str, Any]:
    """Execution options that put the statement's unqualified tables in ``schema``."""
    return {"schema_translate_map": {None: schema}} if schema else {}


# --- commit-time queueing ---------------------------------------------------


@dataclass(frozen=True)
class _Deferred:
    """One event recorded by :func:`defer_events`."""

    id: int
    asset_id: int
    on_conflict: ConflictPolicy
    # The DAG ids this event may queue (None: every consumer).
    allowed: frozenset[str] | None
    # Aliases whose rows (alias, asset link, event link) are written at COMMIT.
    alias_names: tuple[str, ...]
    shape: QueueShape
    schema: str | None
    # The caller's ORM object, if any: its ``timestamp`` is set to the stamp
    # without a reload (expire_on_commit=False sessions keep it).
    obj: object | None


def _queue_deferred(session: Session, entries: list[_Deferred]) -> None:
    # One statement for all, so one policy: a mix is the caller's mistake, not something to merge.
    policies = {entry.on_conflict for entry in entries}
    if len(policies) != 1:
        raise ValueError(f"one transaction cannot queue with two on_conflict policies: {sorted(policies)}")
    on_conflict = policies.pop()
    allowed = {entry.id: entry.allowed for entry in entries if entry.allowed is not None}
    shapes = {entry.shape for entry in entries}
    if len(shapes) != 1:
        raise ValueError(f"one transaction cannot write two queue shapes: {sorted(s.name for s in shapes)}")
    schemas = {entry.schema for entry in entries}
    if len(schemas) != 1:
        raise ValueError(
            f"one transaction cannot write the queues of two schemas: {sorted(map(str, schemas))}"
        )
    # The alias rows first: the statement reads asset_alias_asset_event.
    write_alias_rows(
        session.connection(),
        [AliasedEvent(e.id, e.asset_id, e.alias_names) for e in entries if e.alias_names],
    )
    start = time.perf_counter()
    stamp = queue_events(
        session,
        entries,
        on_conflict=on_conflict,
        allowed=allowed or None,
        shape=shapes.pop(),
        schema=schemas.pop(),
    )
    report("timing", "queue_write", (time.perf_counter() - start) * 1000)
    report("incr", "queue_write.events", len({entry.id for entry in entries}))
    for entry in entries:
        if entry.obj is not None and stamp is not None:
            _set_loaded_timestamp(entry.obj, stamp)


def _set_loaded_timestamp(obj: object, stamp: dt.datetime) -> None:
    state = attributes.instance_state(obj)
    if "timestamp" in state.mapper.attrs:
        attributes.set_committed_value(obj, "timestamp", stamp)


_DEFERRED: DeferredWrites[_Deferred] = DeferredWrites("deferred_events", _queue_deferred)


def defer_events(
    session: Session,
    events: Iterable[EventLike],
    *,
    on_conflict: ConflictPolicy = "auto",
    allowed_dags: Mapping[int, Iterable[str]] | None = None,
    alias_names: Mapping[int, Sequence[str]] | None = None,
    shape: QueueShape = PARTITIONED,
    schema: str | None = None,
) -> None:
    """Record ``events`` to be stamped and queued by ONE statement just before COMMIT.

    The session's ``before_commit`` hook (after a final flush) passes every
    event deferred in the transaction to one :func:`queue_events` call: one
    lock order for all of them, held only for the commit; the stamp is read
    last, then COMMIT. One statement has one ``on_conflict``: deferring with
    a policy other than the one already pending in the transaction raises
    :class:`ValueError`.
    With ``"refresh_after_commit"``, existing rows are moved forwards without
    waiting for them, the held ones after the COMMIT (:mod:`airflow_adrq.refresh`).
    ``events``: flushed ``asset_event`` objects, or anything with integer
    ``id`` and ``asset_id``. ``allowed_dags``, ``shape`` and ``schema`` as in
    :func:`queue_events`. ``alias_names`` (event id -> the aliases it was
    emitted through): their alias rows are written at COMMIT too, just before
    the statement (:func:`airflow_adrq.aliases.write_alias_rows`).

    Nothing is visible before the commit (or :func:`flush_queue`); a rollback
    queues nothing; events of a rolled-back SAVEPOINT are dropped, those of a
    released one queued at the outermost COMMIT. Deferring after the
    commit-time write ran raises :class:`~airflow_adrq.errors.AdrqError`.

    Locks: none until the commit; then as :mod:`airflow_adrq.aliases` and
    :func:`queue_events`. If the statement fails (a deadlock, say),
    ``Session.commit()`` raises and nothing is queued: retry the whole
    transaction. Does not promise anything for a transaction committed other
    than by ``Session.commit()`` (on the raw connection, say).
    """
    check_one_policy(session, on_conflict)
    for event in events:
        event_id, asset_id = event.id, event.asset_id
        if not isinstance(event_id, int) or not isinstance(asset_id, int):
            raise TypeError(f"events need integer id and asset_id (flush them first), got {event!r}")
        obj = event if _is_mapped(event) else None
        only = allowed_dags.get(event_id) if allowed_dags is not None else None
        allowed = frozenset(only) if only is not None else None
        names = tuple(alias_names.get(event_id, ())) if alias_names is not None else ()
        _DEFERRED.add(session, _Deferred(event_id, asset_id, on_conflict, allowed, names, shape, schema, obj))


def check_one_policy(session: Session, on_conflict: object) -> ConflictPolicy:
    """``on_conflict``, if it is a policy and the one already pending in this transaction, if any.

    Else :class:`ValueError`: one transaction is queued by one statement, with one policy.
    """
    policy = dialects.check_policy(on_conflict)
    pending = {entry.on_conflict for entry in _DEFERRED.pending(session)} - {policy}
    if pending:
        raise ValueError(
            f"on_conflict={policy!r}, but this transaction already queues with {pending.pop()!r}: "
            "one transaction is queued by one statement, with one policy"
        )
    return policy


def _is_mapped(obj: object) -> bool:
    try:
        attributes.instance_state(obj)
    except Exception:  # sqlalchemy.orm.exc.UnmappedInstanceError and friends
        return False
    return True


def pending_events(session: Session) -> list[int]:
    """Ids of the events deferred in this session's open transaction and not queued yet, sorted."""
    return sorted({entry.id for entry in _DEFERRED.pending(session)})


def flush_queue(session: Session) -> int:
    """Stamp and queue everything deferred so far in this session, now; return the event count.

    For callers that read the queue before committing. Written in the current (possibly nested)
    transaction: if that SAVEPOINT rolls back, the survivors are queued again at commit. Locks as
    :func:`queue_events`, until the transaction ends (so a scheduler skips those DAGs until then).
    Does not promise the commit-time timing: the stamp is read now (README, "Timing").
    """
    return len({entry.id for entry in _DEFERRED.flush(session)})
