"""Commit-time queueing of explicit ``(asset_id, target_dag_id)`` rows on a Session.

Airflow's ``AssetManager`` computes the consumer DAGs of an asset event in
Python (direct, alias and name/URI references, paused DAGs, multi-team
filtering). This module remembers those rows on the ORM session and writes
them with one ``INSERT`` just before the outermost ``COMMIT``, sorted by
``(asset_id, target_dag_id)``.

Why at commit time: a task with several outlets registers them one by one, in
the iteration order of a Python ``set`` (different in every process). Written
at registration time, two tasks sharing a consumer lock ``(A, d)`` and
``(B, d)`` in opposite orders and deadlock. Written once, sorted, every
transaction takes its queue-row locks in the same global order.

SAVEPOINTs: rows recorded inside a nested transaction that is rolled back are
forgotten with it; rows recorded in a released SAVEPOINT belong to the
enclosing transaction. A rolled-back or closed outermost transaction forgets
everything.

This is Airflow-free on purpose (plain SQLAlchemy + the dialect registry); it
is the part that could move into :mod:`airflow_adrq.queue`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import Table, event
from sqlalchemy.orm import Session, SessionTransaction

from airflow_adrq import dialects

__all__ = ["CHUNK_ROWS", "defer_rows", "flush_rows", "pending_rows"]

log = logging.getLogger(__name__)

#: Rows per INSERT. Chunks are written in the same sorted order, so the lock
#: order stays global; the cap keeps bound parameters (3 per row) well below
#: SQLite's (32766) and PostgreSQL's (65535) limits.
CHUNK_ROWS = 1000

_INFO_KEY = "airflow_adrq.pending_queue"


@dataclass
class _Pending:
    table: Table
    now: Callable[[], dt.datetime]
    # (transaction that recorded the row, asset_id, target_dag_id)
    rows: list[tuple[SessionTransaction, int, str]] = field(default_factory=list)


def defer_rows(
    session: Session,
    table: Table,
    asset_id: int,
    dag_ids: Iterable[str],
    *,
    now: Callable[[], dt.datetime],
) -> None:
    """Record ``(asset_id, dag_id)`` queue rows; they are written just before COMMIT.

    Locks nothing and emits no SQL. At the outermost ``Session.commit()`` all
    rows recorded in this transaction (and not rolled back with a SAVEPOINT)
    are inserted into ``table`` (the ``asset_dag_run_queue`` table, primary
    key ``(asset_id, target_dag_id)``) by :func:`flush_rows`, with
    ``created_at = now()``.

    Does not promise anything if the transaction is committed some other way
    than ``Session.commit()`` (for example on the raw connection).
    """
    pending = _attach(session, table, now)
    if pending.table is not table:
        raise ValueError("one session can only defer rows for one asset_dag_run_queue table")
    transaction = session.get_transaction()
    if transaction is None:
        # Recording without a transaction would leave nothing to attach the
        # rows to; starting one is what the caller's next statement does anyway.
        transaction = session.begin()
    current = session.get_nested_transaction() or transaction
    pending.rows.extend((current, asset_id, dag_id) for dag_id in dag_ids)


def pending_rows(session: Session) -> list[tuple[int, str]]:
    """The distinct ``(asset_id, target_dag_id)`` rows waiting for COMMIT, sorted."""
    pending = _pending(session)
    if pending is None:
        return []
    return sorted({(asset_id, dag_id) for _, asset_id, dag_id in pending.rows})


def flush_rows(session: Session) -> int:
    """Insert the recorded rows now, in one sorted statement; return how many rows were sent.

    Locks, in ``(asset_id, target_dag_id)`` order: each queue row it inserts
    (or, on PostgreSQL, waits for a concurrent uncommitted insert of the same
    key; on MySQL/MariaDB takes an exclusive lock on an existing duplicate),
    plus the FK parents ``asset`` and ``dag`` (PostgreSQL ``FOR KEY SHARE``;
    InnoDB shared record locks). An existing row is left untouched (its
    ``created_at`` is not moved), exactly as Airflow's own writes do.

    More than :data:`CHUNK_ROWS` rows are sent as several statements in the
    same global order. Called automatically before COMMIT; call it yourself
    only if something in the same transaction must read the queue.
    """
    pending = _pending(session)
    if pending is None or not pending.rows:
        return 0
    rows = pending_rows(session)
    created_at = pending.now()
    stmt = dialects.get(session).insert_ignore(pending.table)
    for start in range(0, len(rows), CHUNK_ROWS):
        chunk = rows[start : start + CHUNK_ROWS]
        session.execute(
            stmt.values(
                [
                    {"asset_id": asset_id, "target_dag_id": dag_id, "created_at": created_at}
                    for asset_id, dag_id in chunk
                ]
            )
        )
    pending.rows.clear()
    log.debug("airflow-adrq queued %d asset_dag_run_queue rows in sorted order", len(rows))
    return len(rows)


def _pending(session: Session) -> _Pending | None:
    pending: _Pending | None = session.info.get(_INFO_KEY)
    return pending


def _attach(session: Session, table: Table, now: Callable[[], dt.datetime]) -> _Pending:
    # Instance-level listeners, installed once per Session object: sessions
    # that never queue anything are not touched.
    pending = _pending(session)
    if pending is None:
        pending = session.info[_INFO_KEY] = _Pending(table=table, now=now)
        event.listen(session, "before_commit", _before_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
        event.listen(session, "after_transaction_end", _after_transaction_end)
    return pending


def _before_commit(session: Session) -> None:
    # before_commit also fires when a SAVEPOINT is released; the rows are
    # written only for the outermost COMMIT.
    if session.get_nested_transaction() is not None:
        return
    flush_rows(session)


def _after_soft_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending = _pending(session)
    if pending is None or not pending.rows:
        return
    pending.rows[:] = [row for row in pending.rows if not _within(row[0], previous_transaction)]


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        pending = _pending(session)
        if pending is not None:
            pending.rows.clear()


def _within(transaction: SessionTransaction | None, ancestor: SessionTransaction) -> bool:
    while transaction is not None:
        if transaction is ancestor:
            return True
        transaction = transaction.parent
    return False
