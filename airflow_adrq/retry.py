"""Whole-transaction retry (which errors are retryable: :mod:`airflow_adrq.errorcodes`).

A deadlock victim's transaction is gone: PostgreSQL aborts it, InnoDB rolls it back entirely (and
discards its SAVEPOINTs, so MariaDB/MySQL then report error 1305 "SAVEPOINT ... does not exist" with
the 1213 further down the exception chain). The only safe retry starts again from BEGIN and re-runs
the logic that chose the SQL; anything that is not a database write (listener callbacks, metrics,
messages) runs once, after the COMMIT that succeeded.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from sqlalchemy import event, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_random_exponential

from airflow_adrq import deferral
from airflow_adrq.errorcodes import Retryable, RetryableKind, classify, is_retryable
from airflow_adrq.errors import CommitOutcomeUnknownError, RetriesExhaustedError
from airflow_adrq.metrics import NOWHERE, Metrics
from airflow_adrq.tables import asset_event

__all__ = [
    "Retryable",
    "RetryableKind",
    "classify",
    "commit_outcome",
    "is_retryable",
    "run_callbacks",
    "run_in_transaction",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Callback = Callable[[], object]


# Set by run_in_transaction around each attempt; the engine-wide "commit" listener flips it when a
# COMMIT is about to go to the server (SQLAlchemy emits ConnectionEvents.commit just before it).
_COMMIT_SENT: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "airflow_adrq_commit_sent", default=None
)


def _on_commit(_conn: Connection) -> None:
    sent = _COMMIT_SENT.get()
    if sent is not None:
        sent[0] = True


def run_in_transaction(
    session_factory: Callable[[], Session],
    work: Callable[[Session, list[Callback]], T],
    *,
    max_attempts: int = 5,
    initial_wait: float = 0.05,
    max_wait: float = 2.0,
    on_retry: Callable[[int, Retryable], None] | None = None,
    deadline: float | None = None,
    stop: Callable[[], bool] | None = None,
    metrics: Metrics = NOWHERE,
) -> T:
    """Run ``work(session, callback_sink)`` in a fresh transaction; retry it from BEGIN.

    Each attempt opens a session from ``session_factory``, begins, calls ``work`` and commits. On a
    retryable error (:func:`classify`) the attempt is rolled back, its callbacks dropped,
    ``on_retry(attempt, retryable)`` called, and the unit runs again after a jittered exponential
    backoff (``initial_wait`` doubling up to ``max_wait``): at most ``max_attempts`` times, and no
    more once ``time.monotonic()`` has passed ``deadline`` or ``stop()`` is true. What ``work``
    appends to ``callback_sink`` runs once, after the COMMIT that succeeded (:func:`run_callbacks`).
    Each retry is counted on ``metrics`` as ``transaction_retries``.

    A connection lost before COMMIT was sent is retried on a new connection. Lost while COMMIT was
    in flight, the outcome is unknown and it is not retried:
    :class:`~airflow_adrq.errors.CommitOutcomeUnknownError` carries the transaction's asset event
    ids for :func:`commit_outcome`.

    Locks: whatever ``work`` locks, released by each attempt's COMMIT or ROLLBACK. Does not promise:
    that ``work``'s side effects outside the database happen once (use the callback sink), or
    success: after the last retryable failure allowed it raises
    :class:`~airflow_adrq.errors.RetriesExhaustedError` (``attempts``: the number made) from the
    last error. Other errors propagate after the rollback.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    # On every Engine, once; not at import: an Airflow process that imports the package without
    # retrying transactions gets no listener on its engines.
    if not event.contains(Engine, "commit", _on_commit):
        event.listen(Engine, "commit", _on_commit)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and (found := classify(exc)) is not None:
            metrics.incr("transaction_retries")
            number = state.attempt_number
            log.info("retrying transaction after %s (%s), attempt %d", found.kind.value, found.code, number)
            if on_retry is not None:
                on_retry(number, found)

    def stop_now(state: RetryCallState) -> bool:
        late = deadline is not None and time.monotonic() >= deadline
        return state.attempt_number >= max_attempts or late or (stop is not None and stop())

    retrying = Retrying(
        stop=stop_now,
        wait=wait_random_exponential(multiplier=initial_wait, max=max_wait),
        retry=retry_if_exception(is_retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    callbacks: list[Callback] = []
    try:
        for attempt in retrying:
            with attempt:
                callbacks = []
                result = _attempt(session_factory, work, callbacks)
    except Exception as exc:
        # Not CommitOutcomeUnknownError: it is no database error, so not retryable.
        if is_retryable(exc):
            made = retrying.statistics.get("attempt_number", max_attempts)
            raise RetriesExhaustedError(
                f"transaction failed {made} times with retryable errors; last: {classify(exc)}", attempts=made
            ) from exc
        raise
    run_callbacks(callbacks)
    return result


def _attempt(
    session_factory: Callable[[], Session],
    work: Callable[[Session, list[Callback]], T],
    callbacks: list[Callback],
) -> T:
    """One attempt: BEGIN, ``work``, COMMIT, telling a lost COMMIT apart from a lost transaction."""
    sent = [False]
    token = _COMMIT_SENT.set(sent)
    event_ids: list[int] = []
    try:
        with session_factory() as session, session.begin():
            result = work(session, callbacks)
            # What to look for if the COMMIT's outcome is lost.
            event_ids = deferral.pending_events(session)
            sent[0] = False  # only the COMMIT that follows counts
        return result
    except Exception as exc:
        found = classify(exc)
        if sent[0] and found is not None and found.kind is RetryableKind.CONNECTION_LOST:
            error = CommitOutcomeUnknownError(
                "the database connection was lost while COMMIT was in flight; the transaction may or "
                f"may not have been committed ({found.code}). Not retried: check what was written "
                f"(asset_event ids {event_ids}; see airflow_adrq.retry.commit_outcome) before running "
                "it again."
            )
            error.event_ids = tuple(event_ids)
            raise error from exc
        raise
    finally:
        _COMMIT_SENT.reset(token)


def commit_outcome(session_factory: Callable[[], Session], error: CommitOutcomeUnknownError) -> bool | None:
    """Whether the transaction behind ``error`` was committed: ``True``, ``False``, or ``None`` (can't tell).

    Counts, on a new connection, the ``asset_event`` rows it registered (``error.event_ids``): all
    there, committed; none, not (the server rolls back a transaction whose connection died before
    its COMMIT completed); no ids, or only some, ``None``. Call it once the old connection is gone
    on the server (a killed session may still be rolling back). A plain SELECT; locks nothing.
    """
    ids = sorted(set(error.event_ids))
    if not ids:
        return None
    with session_factory() as session:
        count = select(func.count()).select_from(asset_event).where(asset_event.c.id.in_(ids))
        found = session.execute(count).scalar_one()
    return {len(ids): True, 0: False}.get(found)  # ids is not empty: the keys differ


def run_callbacks(callbacks: Iterable[Callback]) -> None:
    """Call each post-commit callback in order; a failure is logged and does not stop the rest."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("post-commit callback %r failed", callback)
