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

The bookkeeping is :class:`airflow_adrq.txscope.DeferredWrites` (the same mechanism as
:func:`airflow_adrq.queue.defer_dagruns`); what differs from ``defer_dagruns``
is only what is recorded: explicit ``(asset_id, target_dag_id)`` rows that
Airflow's code already computed, instead of assets whose references are
looked up by the statement. Airflow-free on purpose (plain SQLAlchemy, the
dialect registry), so it could move into :mod:`airflow_adrq.queue`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Table
from sqlalchemy.orm import Session

from airflow_adrq import dialects
from airflow_adrq.models import utcnow
from airflow_adrq.txscope import DeferredWrites

__all__ = ["CHUNK_ROWS", "defer_rows", "flush_rows", "pending_rows"]

log = logging.getLogger(__name__)

#: Rows per INSERT. Chunks are written in the same sorted order, so the lock
#: order stays global; the cap keeps bound parameters (3 per row) well below
#: SQLite's (32766) and PostgreSQL's (65535) limits.
CHUNK_ROWS = 1000


@dataclass
class _Rows:
    """One :func:`defer_rows` call."""

    table: Table
    rows: list[tuple[int, str]]


def _sorted_rows(entries: Iterable[_Rows]) -> list[tuple[int, str]]:
    return sorted({row for entry in entries for row in entry.rows})


def _write(session: Session, entries: list[_Rows]) -> None:
    tables = {entry.table for entry in entries}
    if len(tables) != 1:
        raise ValueError("one session can only queue rows for one asset_dag_run_queue table")
    table = tables.pop()
    rows = _sorted_rows(entries)
    created_at = utcnow()
    stmt = dialects.get(session).insert_ignore(table)
    for start in range(0, len(rows), CHUNK_ROWS):
        session.execute(
            stmt.values(
                [
                    {"asset_id": asset_id, "target_dag_id": dag_id, "created_at": created_at}
                    for asset_id, dag_id in rows[start : start + CHUNK_ROWS]
                ]
            )
        )
    log.debug("airflow-adrq queued %d asset_dag_run_queue rows in sorted order", len(rows))


_ROWS: DeferredWrites[_Rows] = DeferredWrites("airflow_plugin_rows", _write)


def defer_rows(
    session: Session,
    table: Table,
    asset_id: int,
    dag_ids: Iterable[str],
) -> None:
    """Record ``(asset_id, dag_id)`` queue rows; they are written just before COMMIT.

    Locks nothing and emits no SQL. Just before the outermost
    ``Session.commit()``, all rows recorded in the transaction (and not
    rolled back with a SAVEPOINT) are inserted into ``table`` (Airflow's
    ``asset_dag_run_queue``, primary key ``(asset_id, target_dag_id)``) as
    :func:`flush_rows` does, with ``created_at`` = the time of the write. A failure of that
    statement makes ``Session.commit()`` raise; nothing is queued.

    Does not promise anything if the transaction is committed some other way
    than ``Session.commit()`` (for example on the raw connection).
    """
    rows = [(asset_id, dag_id) for dag_id in dag_ids]
    if rows:
        _ROWS.add(session, _Rows(table=table, rows=rows))


def pending_rows(session: Session) -> list[tuple[int, str]]:
    """The distinct ``(asset_id, target_dag_id)`` rows not written yet, sorted (the write order)."""
    return _sorted_rows(_ROWS.pending(session))


def flush_rows(session: Session) -> int:
    """Insert the recorded rows now, in one sorted statement; return how many rows were sent.

    Locks, in ``(asset_id, target_dag_id)`` order: each queue row it inserts
    (on PostgreSQL/SQLite it waits for a concurrent uncommitted insert of the
    same key; on MySQL/MariaDB it takes an exclusive lock on an existing
    duplicate), plus the FK parents ``asset`` and ``dag`` (PostgreSQL
    ``FOR KEY SHARE``; InnoDB shared record locks), until the transaction
    ends. An existing row is left untouched (its ``created_at`` is not
    moved), as Airflow's own writes do.

    More than :data:`CHUNK_ROWS` rows are sent as several statements in the
    same global order. Runs automatically before COMMIT; call it yourself
    only if something in the same transaction must read the queue. Rows
    written inside a SAVEPOINT that is then rolled back are written again at
    COMMIT.
    """
    return len(_sorted_rows(_ROWS.flush(session)))
