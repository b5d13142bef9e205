"""Commit-time queueing: events recorded on the session, queued by ONE statement just before COMMIT.

:func:`defer_events` records the events in the session's current transaction (a rolled-back SAVEPOINT
drops its own: :class:`airflow_adrq.txscope.TransactionScoped`) and, at the first deferral, the
:class:`_Statement` settings the transaction is queued with. The commit step is :func:`write_at_commit`,
called by a ``before_commit`` listener on the ``Session`` class (installed when a process first defers
an event) just before every outermost COMMIT of a session with events: it flushes the session, writes
the alias rows and calls :func:`airflow_adrq.queue.queue_events` once with every event not written yet.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from airflow_adrq.dialects import ConflictPolicy, check_policy
from airflow_adrq.errors import DeferredTooLateError
from airflow_adrq.metrics import NOWHERE, Metrics
from airflow_adrq.queue import LOCK_WAIT_S, EventLike, queue_events
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.txscope import TransactionScoped, descends_from

__all__ = ["check_settings", "defer_events", "flush_queue", "pending_events", "write_at_commit"]


@dataclass(frozen=True)
class _Statement:
    """What the transaction's one queue statement is built with: set by its first deferral."""

    on_conflict: ConflictPolicy
    shape: QueueShape = PARTITIONED
    schema: str | None = None
    lock_wait_s: float = LOCK_WAIT_S
    metrics: Metrics = NOWHERE


@dataclass
class _Deferred:
    """One event recorded by :func:`defer_events`."""

    id: int
    asset_id: int
    allowed: frozenset[str] | None  # the DAG ids this event may queue (None: every consumer)
    alias_names: tuple[str, ...]  # aliases whose rows (alias, asset link, event link) are written at COMMIT
    # The caller's event: an ORM one gets the stamp as ``timestamp``, kept by expire_on_commit=False sessions.
    obj: EventLike
    # The transaction whose statement wrote it (flush_queue or the commit); None until then.
    written_in: SessionTransaction | None = None


_STATEMENT_KEY = "airflow_adrq.deferral.statement"
_WRITTEN_KEY = "airflow_adrq.deferral.written_at_commit"


def write_at_commit(session: Session) -> None:
    """The commit step: flush, then queue every event deferred and not written yet, by one statement.

    Called just before the outermost COMMIT of a session that deferred events (and by nothing else);
    an exception aborts the commit. Locks: as :func:`queue_events`.
    """
    session.flush()  # flush hooks may defer more events: they are queued too
    _write(session)
    root = session.get_transaction()
    if root is not None:
        session.info[_WRITTEN_KEY] = weakref.ref(root)


def _write(session: Session) -> list[_Deferred]:
    """Queue the events not written yet with one :func:`queue_events` call; return them."""
    entries = _pending(session)
    if not entries:
        return []
    settings: _Statement = session.info[_STATEMENT_KEY]
    events: list[EventLike] = []
    ids: set[int] = set()
    allowed: dict[int, frozenset[str]] = {}
    aliased: list[tuple[int, int, str]] = []
    for entry in entries:
        events.append(entry.obj)
        ids.add(entry.id)
        if entry.allowed is not None:
            allowed[entry.id] = entry.allowed
        for name in entry.alias_names:
            aliased.append((entry.id, entry.asset_id, name))
    if aliased:
        # Only the standalone manager defers alias names (the plug-in writes Airflow's alias rows
        # itself): the plug-in never loads this module.
        from airflow_adrq.aliases import write_alias_rows

        write_alias_rows(session.connection(), aliased)  # before the statement, which reads them
    start = time.perf_counter()
    queue_events(
        session,
        events,
        on_conflict=settings.on_conflict,
        allowed=allowed or None,
        shape=settings.shape,
        schema=settings.schema,
        lock_wait_s=settings.lock_wait_s,
        metrics=settings.metrics,
    )
    settings.metrics.timing("queue_write", (time.perf_counter() - start) * 1000)
    settings.metrics.incr("queue_write.events", len(ids))
    current = session.get_nested_transaction() or session.get_transaction()
    for entry in entries:
        entry.written_in = current
    return entries


def _before_commit(session: Session) -> None:
    # Every Session's commit passes here once a process has deferred: one dict lookup for the others.
    if _DEFERRED.name_key in session.info and session.get_nested_transaction() is None:
        write_at_commit(session)


_listening = threading.Lock()
_installed = False


def _rolled_back(_session: Session, rolled_back: SessionTransaction, entries: list[_Deferred]) -> None:
    # Rows written inside a rolled-back SAVEPOINT are gone: write those events again at COMMIT.
    for entry in entries:
        if entry.written_in is not None and descends_from(entry.written_in, rolled_back):
            entry.written_in = None


_DEFERRED: TransactionScoped[_Deferred] = TransactionScoped("deferred_events", on_rollback=_rolled_back)


def _pending(session: Session) -> list[_Deferred]:
    return [entry for entry in _DEFERRED.items(session) if entry.written_in is None]


def defer_events(
    session: Session,
    events: Iterable[EventLike],
    *,
    on_conflict: ConflictPolicy = "auto",
    allowed_dags: Mapping[int, Iterable[str]] | None = None,
    alias_names: Mapping[int, Sequence[str]] | None = None,
    shape: QueueShape = PARTITIONED,
    schema: str | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
    metrics: Metrics = NOWHERE,
) -> None:
    """Record ``events`` to be stamped and queued by ONE statement just before COMMIT.

    The commit step (:func:`write_at_commit`, after a final flush) passes every event deferred in the
    transaction to one :func:`queue_events` call: one lock order for all of them, held only for the
    commit; the database's clock is read once, after the consumers' share locks and before the rows
    are written, then COMMIT. One statement has one set of settings (``on_conflict``, shape, schema,
    ``lock_wait_s``, ``metrics``): those of the first deferral still pending; others raise
    :class:`ValueError` (:func:`check_settings` asks before any write). ``events``: flushed
    ``asset_event`` objects, or anything with integer ``id`` and ``asset_id``. ``on_conflict``,
    ``allowed_dags``, ``shape``, ``schema``, ``lock_wait_s`` and ``metrics`` as in :func:`queue_events`.
    ``alias_names`` (event id -> the aliases it was emitted through): their alias rows are written at
    COMMIT too, just before the statement (:func:`airflow_adrq.aliases.write_alias_rows`).

    Nothing is visible before the commit (or :func:`flush_queue`); a rollback queues nothing; events
    of a rolled-back SAVEPOINT are dropped, those of a released one queued at the outermost COMMIT.
    Deferring after the commit-time write ran raises :class:`~airflow_adrq.errors.DeferredTooLateError`.

    Locks: none until the commit; then as :mod:`airflow_adrq.aliases` and :func:`queue_events`. If
    the statement fails (a deadlock, say), ``Session.commit()`` raises and nothing is queued: retry
    the whole transaction. Does not promise anything for a transaction committed other than by
    ``Session.commit()`` (on the raw connection, say).
    """
    wanted = _Statement(check_policy(on_conflict), shape, schema, lock_wait_s, metrics)
    _check(session, wanted)
    session.info[_STATEMENT_KEY] = wanted
    for deferred in events:
        event_id, asset_id = deferred.id, deferred.asset_id
        if not isinstance(event_id, int) or not isinstance(asset_id, int):
            raise TypeError(f"events need integer id and asset_id (flush them first), got {deferred!r}")
        only = (allowed_dags or {}).get(event_id)
        names = tuple((alias_names or {}).get(event_id, ()))
        allowed = None if only is None else frozenset(only)
        _DEFERRED.add(session, _Deferred(event_id, asset_id, allowed, names, deferred))
    global _installed
    if not _installed:  # the commit step's listener, once per process
        with _listening:
            if not event.contains(Session, "before_commit", _before_commit):
                event.listen(Session, "before_commit", _before_commit)
            _installed = True


def check_settings(
    session: Session,
    *,
    on_conflict: ConflictPolicy = "auto",
    shape: QueueShape = PARTITIONED,
    schema: str | None = None,
    lock_wait_s: float = LOCK_WAIT_S,
    metrics: Metrics = NOWHERE,
) -> None:
    """Raise what :func:`defer_events` would for these settings in the session's transaction; record nothing.

    For callers that check before they write anything (the standalone manager's registrations).
    """
    _check(session, _Statement(check_policy(on_conflict), shape, schema, lock_wait_s, metrics))


def _check(session: Session, wanted: _Statement) -> None:
    written: weakref.ref[SessionTransaction] | None = session.info.get(_WRITTEN_KEY)
    if written is not None and written() is not None and written() is session.get_transaction():
        raise DeferredTooLateError(
            "an asset event was deferred after this transaction's commit-time write had run "
            "(from a before_commit listener registered after airflow-adrq's?). Register it "
            'before committing, or queue it now from that listener (queue_mode="immediate").'
        )
    held: _Statement | None = session.info.get(_STATEMENT_KEY)
    if held is not None and held != wanted and _pending(session):
        if held.on_conflict != wanted.on_conflict:
            raise ValueError(
                f"on_conflict={wanted.on_conflict!r}, but this transaction already queues with "
                f"{held.on_conflict!r}: one transaction is queued by one statement, with one policy"
            )
        raise ValueError(f"one transaction is queued by one statement: {wanted} differs from {held}")


def pending_events(session: Session) -> list[int]:
    """Ids of the events deferred in this session's open transaction and not queued yet, sorted."""
    return sorted({entry.id for entry in _pending(session)})


def flush_queue(session: Session) -> int:
    """Stamp and queue everything deferred so far in this session, now; return the event count.

    For callers that read the queue before committing. Written in the current (possibly nested)
    transaction: if that SAVEPOINT rolls back, the survivors are queued again at commit. Locks as
    :func:`queue_events`, until the transaction ends (so a scheduler skips those DAGs until then).
    Does not promise the commit-time timing: the stamp is read now (GUARANTEES.md, "Timing").
    """
    return len({entry.id for entry in _write(session)})
