"""Queue downstream DAG runs with ONE ordered, set-based statement per transaction: which writer, with what.

:func:`queue_events` checks the events and the connection, resolves ``on_conflict``, cuts the event ids
into chunks within the bound-parameter limits and hands them to one writer, which sends the SQL:

* the backend's own (:mod:`airflow_adrq.dialects.postgresql`, :mod:`~airflow_adrq.dialects.mysql`,
  :mod:`~airflow_adrq.dialects.sqlite`) where the scheduler locks rows: each queue row is written once,
  with the stamp, while the consumers' ``dag`` rows are held ``FOR SHARE`` (a scheduler skips such a DAG,
  so no run is made over a window holding an event stamped and not yet visible: GUARANTEES.md, "Timing");
* :mod:`airflow_adrq.refresh` where the scheduler takes no row locks (MariaDB, ``[scheduler]
  use_row_level_locking = False``), loaded only then: a ``dag`` lock would order nothing there;
* :func:`stamp_then_insert` for Airflow 3.4's per-event queue, which needs no ``dag`` lock.

:mod:`airflow_adrq.deferral` calls :func:`queue_events` once per transaction, just before COMMIT.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from sqlalchemy import inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import InstanceState, Session, attributes

from airflow_adrq import dialects, statement
from airflow_adrq.dialects import ConflictPolicy
from airflow_adrq.metrics import NOWHERE, Metrics
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.statement import Form
from airflow_adrq.tables import utcnow

__all__ = ["IDS_PER_STATEMENT", "LOCK_WAIT_S", "EventLike", "clock_on_events", "in_schema", "queue_events"]

#: Ids bound to one statement, below SQLite's 32,766 and psycopg 3's 65,535
#: bound-parameter limits. Larger sets: several statements.
IDS_PER_STATEMENT = 30_000
#: How long, in all, a queue write may wait for busy consumer ``dag`` rows by default (seconds; PostgreSQL).
#: Longer than the DAG processor holds a large file's DAGs while it saves them.
LOCK_WAIT_S = 60.0


class EventLike(Protocol):
    """An ``asset_event`` row: ours, Airflow's ORM ``AssetEvent``, or a plain record."""

    @property
    def id(self) -> int: ...

    @property
    def asset_id(self) -> int: ...


def stamp_then_insert(
    conn: Connection, form: Form, chunk_params: list[dict[str, Any]], options: Mapping[str, Any]
) -> tuple[dt.datetime, int]:
    """One reading of the clock on the events, then the ordered ``INSERT ... SELECT`` of each chunk.

    Every backend's write past its locks (and the whole of SQLite's and 3.4's per-event queue's).
    Returns the stamp and the rows written.
    """
    backend = dialects.get(conn)
    stamp = clock_on_events(conn, [event_id for p in chunk_params for event_id in p["ids"]], options)
    stmt = statement.insert_statement(backend.name, form)
    rows = 0
    for params in chunk_params:
        result = conn.execute(stmt, {**params, "created_at": stamp}, execution_options=options)
        rows += backend.rows_written(conn, result)
    return stamp, rows


def clock_on_events(conn: Connection, ids: list[int], options: Mapping[str, Any]) -> dt.datetime:
    """One reading of the database's clock (SQLite: Python's), put on the events ``ids``; returns it.

    Locks the given ``asset_event`` rows (the caller's own, uncommitted).
    """
    clock = dialects.get(conn).clock
    stamp = conn.execute(select(clock())).scalar_one() if clock is not None else utcnow()
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        chunk = ids[start : start + IDS_PER_STATEMENT]
        conn.execute(statement.STAMP_EVENTS, {"ids": chunk, "stamp": stamp}, execution_options=options)
    return stamp


def _chunks(events: Iterable[EventLike]) -> list[list[int]]:
    """Event ids in ``(asset_id, id)`` order, cut only between assets (3.3's key leads with the asset)."""
    # (And an asset's rows must come from one statement: which alias rows it
    # reads depends on which events are in it.)
    chunks: list[list[int]] = []
    last_asset: int | None = None
    for asset_id, event_id in sorted({(event.asset_id, event.id) for event in events}):
        if not chunks or (len(chunks[-1]) >= IDS_PER_STATEMENT and asset_id != last_asset):
            chunks.append([])
        chunks[-1].append(event_id)
        last_asset = asset_id
    return chunks


def queue_events(
    bind: Session | Connection,
    events: Iterable[EventLike],
    *,
    on_conflict: ConflictPolicy = "auto",
    allowed: Mapping[int, Iterable[str]] | None = None,
    shape: QueueShape = PARTITIONED,
    schema: str | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
    metrics: Metrics = NOWHERE,
) -> dt.datetime | None:
    """Queue the consumers of ``events`` now and stamp them; return the stamp (no events: ``None``).

    In the caller's transaction, without committing. Pass only the caller's own uncommitted events, and
    COMMIT next, as the commit-time write does. With ``"refresh"`` or ``"ignore"`` (``"auto"`` where the
    scheduler locks rows):

    1. **Share-lock** every consumer's ``dag`` row (paused or not, every kind of reference; 3.4's
       per-event queue needs none), in byte order. This is where it may wait: for a scheduler creating
       those DAGs' runs, the DAG processor saving them, a pause. PostgreSQL never waits while it holds
       one, and a wait ended by others' deadlock is waited again (:mod:`airflow_adrq.dialects.postgresql`),
       for at most ``lock_wait_s`` seconds in all, except past the bound-parameter limit (more than
       :data:`IDS_PER_STATEMENT` events, or multi-team pairs), where it waits in byte order holding
       those before; MySQL 8 waits in primary-key order.
    2. **Stamp**: the database's clock (``clock_timestamp()`` once the locks are held,
       ``UTC_TIMESTAMP(6)``; SQLite: Python's, one host).
    3. **Write** the events' ``timestamp`` and the queue rows with it, each row once, by ONE ordered
       ``INSERT ... SELECT`` (past :data:`IDS_PER_STATEMENT` events, several); it
       may wait for producers inserting the same rows. PostgreSQL: steps 1-3 are one statement.

    With ``"refresh_after_commit"`` (``"auto"`` where the scheduler takes no row locks) there is no
    ``dag`` lock to order by: the rows are written at :data:`~airflow_adrq.refresh.PENDING`, then
    stamped once all are locked, so producers sharing a row are stamped in commit order (GUARANTEES.md,
    "Timing").

    ``on_conflict``: ``"refresh"`` gives an existing row the stamp, ``"ignore"`` leaves it,
    ``"refresh_after_commit"`` moves it forwards without waiting for it: now if no one holds it, else
    after the Session's COMMIT (:mod:`airflow_adrq.refresh`; a bare Connection: ``"ignore"``),
    ``"auto"``: :func:`airflow_adrq.dialects.resolve`. ``allowed``: event id -> the only DAG ids it may
    queue (multi-team). ``shape``: :mod:`airflow_adrq.shapes`; ``schema``:
    ``[database] sql_alchemy_schema``. ``lock_wait_s``: PostgreSQL's longest wait for busy consumer
    rows, then :class:`~airflow_adrq.errors.LockWaitTimeoutError`. Counts the queue rows inserted or
    moved forwards on ``metrics`` (:mod:`airflow_adrq.metrics`) as ``queue_write.rows`` (MySQL/MariaDB:
    affected rows, where a row moved forwards counts 2).

    Locks, until the transaction ends: the consumers' ``dag`` rows ``FOR SHARE`` (not with
    ``"refresh_after_commit"``); the queue rows it inserts and, with ``"refresh"``, the existing ones,
    in ``(asset_id, target_dag_id)`` order (3.4: ``(target_dag_id, asset_event_id)``; MySQL/MariaDB skip
    existing rows that need no write by a lock-free ``NOT EXISTS`` probe); the given ``asset_event``
    rows. FK checks share-lock the ``asset`` and ``dag`` parents (PostgreSQL ``FOR KEY SHARE``). Reads
    the reference tables, ``asset`` and ``asset_alias_asset_event`` without locks (READ COMMITTED;
    MySQL/MariaDB refuse other levels: :mod:`airflow_adrq.dialects.mysql`).

    Does not promise: no deadlock with earlier statements of the same transaction that locked queue or
    ``dag`` rows (use :func:`defer_events`), or, on MySQL 8, with a ``dag`` writer locking several of
    these rows against primary-key order (retry the whole transaction:
    :func:`airflow_adrq.retry.run_in_transaction`). A popular consumer is skipped by the scheduler while
    any producer holds its lock.
    """
    events = list(events)
    chunks = _chunks(events)
    if not chunks:
        return None
    conn = bind.connection() if isinstance(bind, Session) else bind
    backend = dialects.get(conn)
    backend.check_connection(conn)
    mode = dialects.resolve(on_conflict, conn)
    # The statement itself refreshes only with "refresh" (a refresh after COMMIT leaves the row to it).
    form = Form("events", "refresh" if mode == "refresh" else "ignore", shape, bool(allowed))
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
        stamp, rows = refresh.write_then_stamp(bind, conn, form, chunk_params, asset_ids, options, metrics)
    elif form.shape.event_keyed:
        # 3.4's per-event queue: a run consumes exactly the events its rows name, no dag lock needed.
        stamp, rows = stamp_then_insert(conn, form, chunk_params, options)
    else:
        stamp, rows = backend.write(conn, form, chunk_params, options, lock_wait_s, metrics)
    metrics.incr("queue_write.rows", rows)
    for event in events:
        set_loaded_timestamp(event, stamp)
    return stamp


def in_schema(schema: str | None) -> dict[str, Any]:
    """Execution options that put the statement's unqualified tables in ``schema``."""
    return {"schema_translate_map": {None: schema}} if schema else {}


def set_loaded_timestamp(obj: object, stamp: dt.datetime) -> None:
    """Give a mapped event its stored ``timestamp`` without a reload; leave anything else alone."""
    state = inspect(obj, raiseerr=False)
    if isinstance(state, InstanceState) and "timestamp" in state.mapper.attrs:
        attributes.set_committed_value(obj, "timestamp", stamp)
