"""``register_asset_change``: a drop-in for Airflow 3.3's, with deadlock-free queueing.

Same keyword signature, return value and database effects as Airflow 3.3.2's
``AssetManager.register_asset_change``, except, on purpose:

* the queue rows are written by ONE ordered statement (:mod:`airflow_adrq.queue`), by default just
  before COMMIT for every event of the transaction;
* listener callbacks go to ``callback_sink`` (as in Airflow's Execution API) or run after the
  outermost COMMIT (Airflow runs them inline), and are dropped on rollback.

Out of scope standalone (the plug-in, :mod:`airflow_adrq.airflow`, keeps Airflow's own code for
these): multi-team filtering (``source_is_api`` and the ``api_*`` arguments are ignored),
partitioned DAGs (an event with a ``partition_key`` queues nothing here, as in Airflow), the
``asset.updates`` metric, and Airflow's listener manager (:func:`add_listener` stands in for its
``on_asset_changed`` / ``on_asset_event_emitted`` hooks).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from sqlalchemy import Table, and_, bindparam, insert, select
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.sql.dml import Insert

from airflow_adrq import dialects, queue, statement
from airflow_adrq.aliases import write_alias_rows
from airflow_adrq.deferral import check_settings, defer_events
from airflow_adrq.dialects import ConflictMode, ConflictPolicy, check_policy
from airflow_adrq.metrics import NOWHERE, Metrics
from airflow_adrq.models import AssetActive, AssetEvent, AssetModel, utcnow
from airflow_adrq.retry import Callback, run_callbacks
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.txscope import TransactionScoped

__all__ = [
    "AssetChange",
    "AssetEventInfo",
    "AssetLike",
    "Listener",
    "QueueMode",
    "TaskInstanceLike",
    "add_listener",
    "build_queue_statement",
    "notify",
    "queue_dagruns",
    "register_asset_change",
    "register_asset_changes",
    "remove_listener",
]

log = logging.getLogger(__name__)

QueueMode = Literal["commit", "immediate"]


class AssetLike(Protocol):
    """Anything with an asset's ``name`` and ``uri`` (Airflow's Asset, AssetModel, ...)."""

    @property
    def name(self) -> str: ...
    @property
    def uri(self) -> str: ...


class TaskInstanceLike(Protocol):
    """The source task fields an asset event records."""

    @property
    def dag_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def map_index(self) -> int: ...


@dataclass(frozen=True)
class AssetChange:
    """One asset event to register (the per-event arguments of ``register_asset_change``)."""

    asset: AssetLike
    extra: Mapping[str, Any] | None = None
    source_alias_names: Collection[str] = ()
    partition_key: str | None = None
    partition_date: dt.datetime | None = None
    _alias_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not all(isinstance(getattr(self.asset, attr, None), str) for attr in ("name", "uri")):
            raise TypeError(f"asset must have str 'name' and 'uri' attributes, got {self.asset!r}")
        if self.extra is not None and not isinstance(self.extra, Mapping):
            raise TypeError(f"extra must be a mapping or None, not {type(self.extra).__name__}")
        if self.extra:
            # The column is JSON: fail here, before anything is written, not in the driver halfway
            # through the transaction. NaN and infinities are not JSON (PostgreSQL and MySQL refuse them).
            try:
                json.dumps(self.extra, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"extra must be JSON-serialisable: {exc}") from exc
        if isinstance(self.source_alias_names, str | bytes):
            raise TypeError("source_alias_names must be a collection of names, not a single string")
        names = tuple(self.source_alias_names)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"alias names must be strings, got {names!r}")
        if self.partition_key is not None and not isinstance(self.partition_key, str):
            raise TypeError(f"partition_key must be a string or None, not {self.partition_key!r}")
        # Keep the caller's order (Airflow inserts alias links in that order), once each.
        object.__setattr__(self, "_alias_names", tuple(dict.fromkeys(names)))


@dataclass(frozen=True)
class AssetEventInfo:
    """What a listener learns about one committed asset event."""

    event_id: int
    asset_id: int
    asset_name: str
    asset_uri: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    source_dag_id: str | None = None
    source_task_id: str | None = None
    source_run_id: str | None = None
    source_map_index: int | None = None
    source_alias_names: tuple[str, ...] = ()
    partition_key: str | None = None
    partition_date: dt.datetime | None = None


Listener = Callable[[AssetEventInfo], object]

_listeners: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Call ``listener(info)`` for every asset event, after its transaction commits."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling ``listener``; unknown listeners are ignored."""
    if listener in _listeners:
        _listeners.remove(listener)


def notify(info: AssetEventInfo) -> None:
    """Call every listener with ``info``; a failing listener is logged, not raised (as Airflow does)."""
    for listener in list(_listeners):
        try:
            listener(info)
        except Exception:
            log.exception("error calling asset event listener %r", listener)


# Listener callbacks of sessions without a callback_sink: run after COMMIT.
_AFTER_COMMIT: TransactionScoped[Callback] = TransactionScoped(
    "after_commit", after_commit=lambda _session, callbacks: run_callbacks(callbacks)
)


def register_asset_change(
    *,
    task_instance: TaskInstanceLike | None = None,
    asset: AssetLike,
    extra: Mapping[str, Any] | None = None,
    source_alias_names: Collection[str] = (),
    session: Session,
    partition_key: str | None = None,
    partition_date: dt.datetime | None = None,
    source_is_api: bool = False,
    api_user_teams: set[str] | None = None,
    api_allow_consumer_teams: list[str] | None = None,
    api_allow_global_consumers: bool = True,
    callback_sink: list[Callback] | None = None,
    queue_mode: QueueMode = "commit",
    on_conflict: ConflictPolicy = "auto",
    metrics: Metrics = NOWHERE,
    **kwargs: Any,
) -> AssetEvent | None:
    """Record an asset event and queue the DAGs scheduled on the asset.

    Looks the asset up by ``(name, uri)``: unknown, it logs a warning and returns ``None`` (nothing
    written); inactive, it logs a warning and goes on. Inserts the ``asset_event`` (source fields
    from ``task_instance``), links the asset to ``source_alias_names`` (creating missing aliases)
    and queues the unpaused DAGs scheduled on the asset directly, by name, by URI or through those
    aliases, unless ``partition_key`` is given. Unknown keyword arguments are ignored, as in Airflow.
    The queue write counts and times itself on ``metrics`` (:mod:`airflow_adrq.metrics`; default:
    nowhere).

    Locks: now, only the new ``asset_event`` rows (new keys, no waits). At COMMIT
    (``queue_mode="commit"``, with every other event of the transaction) or now (``"immediate"``):
    the alias rows (:func:`airflow_adrq.aliases.write_alias_rows`), then as
    :func:`airflow_adrq.queue.queue_events` (which also says what ``on_conflict`` does): the
    consumers' ``dag`` rows, the queue rows in ``(asset_id, target_dag_id)`` order and the events,
    stamped. So the returned event's ``timestamp`` is the time of that write, not of this call
    (GUARANTEES.md, "Timing: which events a run consumes").

    Does not commit, and does not retry: run the whole transaction under
    :func:`airflow_adrq.retry.run_in_transaction` (or your own retry-from-BEGIN) to survive
    deadlocks with other writers.
    """
    del source_is_api, api_user_teams, api_allow_consumer_teams, api_allow_global_consumers, kwargs
    change = AssetChange(asset, extra, source_alias_names, partition_key, partition_date)
    (event,) = register_asset_changes(
        session=session,
        changes=[change],
        task_instance=task_instance,
        callback_sink=callback_sink,
        queue_mode=queue_mode,
        on_conflict=on_conflict,
        metrics=metrics,
    )
    return event


def register_asset_changes(
    *,
    session: Session,
    changes: Iterable[AssetChange],
    task_instance: TaskInstanceLike | None = None,
    callback_sink: list[Callback] | None = None,
    queue_mode: QueueMode = "commit",
    on_conflict: ConflictPolicy = "auto",
    metrics: Metrics = NOWHERE,
) -> list[AssetEvent | None]:
    """Register several asset events at once (a task's outlets); one result per change.

    Same effects and locks as :func:`register_asset_change` for each change, with one asset lookup,
    one alias read, and all the queueing in ONE statement (now for ``queue_mode="immediate"``).
    """
    changes = list(changes)
    if queue_mode not in ("commit", "immediate"):
        raise ValueError(f"queue_mode must be 'commit' or 'immediate', not {queue_mode!r}")
    if queue_mode == "commit":  # before any write: the call fails whole
        check_settings(session, on_conflict=on_conflict, metrics=metrics)
    else:
        check_policy(on_conflict)
    if not changes:
        return []
    found = _lookup_assets(session, {(c.asset.name, c.asset.uri) for c in changes})
    registered: list[tuple[AssetChange, int]] = []
    positions: list[int] = []  # of the registered changes in ``changes`` (a change may come twice)
    for position, change in enumerate(changes):
        key = (change.asset.name, change.asset.uri)
        if key not in found:
            log.warning("AssetModel %s not found; cannot create asset event.", change.asset)
            continue
        asset_id, active = found[key]
        if not active:
            log.warning("Emitting event for inactive AssetModel %s", change.asset)
        registered.append((change, asset_id))
        positions.append(position)
    events = _insert_events(session, registered, task_instance)
    pairs = list(zip((change for change, _ in registered), events, strict=True))
    if queue_mode == "immediate":
        rows = [(event.id, event.asset_id, name) for change, event in pairs for name in change._alias_names]
        write_alias_rows(session.connection(), rows)
        queue.queue_events(session, events, on_conflict=on_conflict, metrics=metrics)
    else:
        aliased = {event.id: change._alias_names for change, event in pairs if change._alias_names}
        defer_events(session, events, on_conflict=on_conflict, alias_names=aliased, metrics=metrics)

    results: list[AssetEvent | None] = [None] * len(changes)
    for position, registered_event in zip(positions, events, strict=True):
        results[position] = registered_event
    for change, event in pairs:
        info = AssetEventInfo(
            event_id=event.id,
            asset_id=event.asset_id,
            asset_name=change.asset.name,
            asset_uri=change.asset.uri,
            extra=dict(event.extra),
            source_dag_id=event.source_dag_id,
            source_task_id=event.source_task_id,
            source_run_id=event.source_run_id,
            source_map_index=event.source_map_index,
            source_alias_names=change._alias_names,
            partition_key=change.partition_key,
            partition_date=change.partition_date,
        )
        callback = functools.partial(notify, info)
        if callback_sink is not None:
            callback_sink.append(callback)
        else:
            _AFTER_COMMIT.add(session, callback)
    return results


_ASSET = cast(Table, AssetModel.__table__)
_ACTIVE = cast(Table, AssetActive.__table__)
_EVENT = cast(Table, AssetEvent.__table__)

# A constant shape (compiled once): the expanding list changes length, not SQL. ``name IN (...)``
# uses the leading column of the (name, uri) unique index on every backend; the URI is checked in
# Python. (Adding ``AND uri IN (...)`` makes SQLite probe every name x uri pair: quadratic.)
_LOOKUP = (
    select(_ASSET.c.name, _ASSET.c.uri, _ASSET.c.id, _ACTIVE.c.name.is_not(None))
    .outerjoin(_ACTIVE, and_(_ACTIVE.c.name == _ASSET.c.name, _ACTIVE.c.uri == _ASSET.c.uri))
    .where(_ASSET.c.name.in_(bindparam("names", expanding=True)))
)
_INSERT_EVENT = insert(_EVENT)
_INSERT_EVENT_RETURNING = insert(_EVENT).returning(_EVENT.c.id)
_INSERT_EVENTS_RETURNING_IN_ORDER = insert(_EVENT).returning(_EVENT.c.id, sort_by_parameter_order=True)
#: Names per lookup (one expanding list; below every backend's parameter limit).
_NAMES_PER_LOOKUP = 10_000


def _lookup_assets(session: Session, keys: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, bool]]:
    """(name, uri) -> (asset id, is active), one plain SELECT, no row locks."""
    names = sorted({name for name, _ in keys})
    found: dict[tuple[str, str], tuple[int, bool]] = {}
    conn = session.connection()  # Core execution: no ORM statement processing
    for start in range(0, len(names), _NAMES_PER_LOOKUP):
        chunk = names[start : start + _NAMES_PER_LOOKUP]
        for name, uri, asset_id, is_active in conn.execute(_LOOKUP, {"names": chunk}):
            if (name, uri) in keys:
                found[(name, uri)] = (asset_id, bool(is_active))
    return found


def _insert_events(
    session: Session, registered: Sequence[tuple[AssetChange, int]], task_instance: TaskInstanceLike | None
) -> list[AssetEvent]:
    """INSERT the events (Core, RETURNING ids where the dialect can) and return them as ORM objects.

    Attached to ``session`` as persistent rows, as a flush leaves them, without another round trip.
    """
    if not registered:
        return []
    now = utcnow()
    source = {
        "source_task_id": None if task_instance is None else task_instance.task_id,
        "source_dag_id": None if task_instance is None else task_instance.dag_id,
        "source_run_id": None if task_instance is None else task_instance.run_id,
        # Without a task: the column's server default, as Airflow leaves it.
        "source_map_index": -1 if task_instance is None else task_instance.map_index,
    }
    rows = [
        {
            "asset_id": asset_id,
            "extra": dict(change.extra or {}),
            "partition_key": change.partition_key,
            "timestamp": now,
            **source,
        }
        for change, asset_id in registered
    ]
    conn = session.connection()
    if len(rows) > 1 and conn.dialect.insert_executemany_returning_sort_by_parameter_order:
        ids = list(conn.execute(_INSERT_EVENTS_RETURNING_IN_ORDER, rows).scalars())
    elif conn.dialect.insert_returning:
        ids = [conn.execute(_INSERT_EVENT_RETURNING, row).scalar_one() for row in rows]
    else:
        # MySQL 8 has no RETURNING: one INSERT per event, id from LAST_INSERT_ID().
        ids = []
        for row in rows:
            key = conn.execute(_INSERT_EVENT, row).inserted_primary_key
            assert key is not None  # an INSERT of one row always has one
            ids.append(int(key[0]))
    events = [AssetEvent(id=event_id, **row) for row, event_id in zip(rows, ids, strict=True)]
    for event in events:
        make_transient_to_detached(event)
        session.add(event)
    return events


def queue_dagruns(
    bind: Session | Connection,
    asset_ids: Iterable[int],
    *,
    created_at: dt.datetime | None = None,
    on_conflict: ConflictPolicy = "auto",
) -> None:
    """Queue the consumers of assets (without events) now, with one statement.

    Direct, name and URI references only (an alias counts only for events emitted through it);
    ``created_at`` defaults to now. Runs in the caller's transaction, does not commit. Locks: the queue
    rows it inserts (and, with ``"refresh"``, the existing ones) in ``(asset_id, target_dag_id)`` order;
    FK checks share-lock the ``asset`` and ``dag`` parents. It takes no ``dag`` share lock and reads
    no clock of the database's: a scheduler may make a run between this statement and the COMMIT
    without its rows. Does not promise: one order with the transaction's other queue writes (this is a
    statement of its own).
    """
    ids = sorted(set(asset_ids))
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise TypeError(f"asset ids must be ints, got {ids!r}")
    if not ids:
        return
    conn = bind.connection() if isinstance(bind, Session) else bind
    dialects.get(conn).check_connection(conn)
    # Any other policy leaves an existing row in this statement.
    mode: ConflictMode = "refresh" if dialects.resolve(on_conflict, conn) == "refresh" else "ignore"
    stmt = build_queue_statement(conn.dialect, source="assets", on_conflict=mode)
    for start in range(0, len(ids), queue.IDS_PER_STATEMENT):
        chunk = ids[start : start + queue.IDS_PER_STATEMENT]
        conn.execute(stmt, {"ids": chunk, "created_at": created_at or utcnow()})


def build_queue_statement(
    dialect: Dialect | str,
    *,
    source: statement.Source = "events",
    on_conflict: ConflictMode = "refresh",
    shape: QueueShape = PARTITIONED,
) -> Insert:
    """The one ``INSERT ... SELECT ... ORDER BY`` that queues consumers, for ``dialect``; built once.

    Execute with ``{"ids": [...], "created_at": aware datetime}``: ``asset_event`` ids for
    ``source="events"``, ``asset`` ids for ``source="assets"`` (no aliases: an alias counts only for
    the events emitted through it). ``on_conflict="refresh"`` moves an existing row's ``created_at``
    forwards, ``"ignore"`` leaves it (Airflow's ``DO NOTHING``). ``shape``: the schema written
    (:mod:`airflow_adrq.shapes`; default Airflow 3.3's, the models'). Executing it locks the queue rows
    it inserts (with ``"refresh"``, the existing ones too) in the queue's key order. It is the bare
    ``INSERT``: not what :func:`queue_events` sends (no ``dag`` share lock, no clock of the database's).
    """
    if source not in ("events", "assets"):
        raise ValueError(f"source must be 'events' or 'assets', not {source!r}")
    if on_conflict not in ("ignore", "refresh"):
        raise ValueError(f"on_conflict must be 'ignore' or 'refresh', not {on_conflict!r}")
    return statement.insert_statement(dialects.get(dialect).name, statement.Form(source, on_conflict, shape))
