"""Commit-time queueing: events recorded on the session, queued by ONE statement just before COMMIT.

:func:`defer_events` records; the ``before_commit`` hook that
:mod:`airflow_adrq.txscope` installs runs ``_queue_deferred`` once per
outermost COMMIT, which writes the alias rows and calls
:func:`airflow_adrq.queue.queue_events` with every event still alive in the
transaction (those of rolled-back SAVEPOINTs dropped).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from airflow_adrq import dialects, metrics
from airflow_adrq.aliases import AliasedEvent, write_alias_rows
from airflow_adrq.dialects import ConflictPolicy
from airflow_adrq.queue import EventLike, is_mapped, queue_events, set_loaded_timestamp
from airflow_adrq.shapes import PARTITIONED, QueueShape
from airflow_adrq.txscope import DeferredWrites

__all__ = ["check_one_policy", "defer_events", "flush_queue", "pending_events"]


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
    # One statement for all, so one policy: defer_events admits no second one (check_one_policy).
    on_conflict = entries[0].on_conflict
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
    metrics.report("timing", "queue_write", (time.perf_counter() - start) * 1000)
    metrics.report("incr", "queue_write.events", len({entry.id for entry in entries}))
    for entry in entries:
        if entry.obj is not None and stamp is not None:
            set_loaded_timestamp(entry.obj, stamp)


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
        obj = event if is_mapped(event) else None
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


def pending_events(session: Session) -> list[int]:
    """Ids of the events deferred in this session's open transaction and not queued yet, sorted."""
    return sorted({entry.id for entry in _DEFERRED.pending(session)})


def flush_queue(session: Session) -> int:
    """Stamp and queue everything deferred so far in this session, now; return the event count.

    For callers that read the queue before committing. Written in the current (possibly nested)
    transaction: if that SAVEPOINT rolls back, the survivors are queued again at commit. Locks as
    :func:`queue_events`, until the transaction ends (so a scheduler skips those DAGs until then).
    Does not promise the commit-time timing: the stamp is read now (GUARANTEES.md, "Timing").
    """
    return len({entry.id for entry in _DEFERRED.flush(session)})
