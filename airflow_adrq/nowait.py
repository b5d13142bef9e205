"""PostgreSQL: the one-statement queue write, never waiting while it holds a consumer's ``dag`` row.

Airflow's writers of ``dag`` lock rows in orders of their own (the DAG processor's ``find_orm_dags ...
FOR NO KEY UPDATE`` and its flushes, the ``UPDATE dag SET is_paused`` of ``PATCH /dags``, a scheduler's
pass), so no order of ours matches them all. The write therefore never waits while it holds one; what
it sends, in order, under one SAVEPOINT (``adrq_share_lock``)::

    SAVEPOINT adrq_share_lock
    WITH ... FOR SHARE OF dag NOWAIT ...          -- the whole write (statement.write_once): done, or 55P03
    -- a consumer's row was busy:
    ROLLBACK TO SAVEPOINT adrq_share_lock
    SELECT dag_id ... (every consumer)            -- which rows are busy: the consumers ...
    SELECT dag_id ... FOR SHARE OF dag SKIP LOCKED  -- ... minus those free now
    ROLLBACK TO SAVEPOINT adrq_share_lock         -- holds no dag row of ours from here
    SELECT current_setting('lock_timeout')
    -- per busy row, in byte order:
    SELECT set_config('lock_timeout', '<ms left>ms', true)
    SELECT dag_id FROM dag WHERE dag_id = $1 FOR SHARE OF dag    -- waits for its holder
    ROLLBACK TO SAVEPOINT adrq_share_lock         -- (not after the last: see below)
    SELECT set_config('lock_timeout', '<as before>', true)
    -- then the NOWAIT write again

**Never a victim of someone else's cycle.** While it waits it holds no ``dag`` row, but PostgreSQL
makes the first waiter for a row hold the row's tuple lock, so a cycle between two other writers
(say the DAG processor waits for a bulk ``PATCH``, which waits for the row the producer is queued
for) runs through the producer, and as the oldest waiter it is the one whose ``deadlock_timeout``
fires first: it is chosen as the victim. So a deadlock (40P01) or lock timeout (55P03) raised by a
wait is caught: back to the SAVEPOINT (which drops the tuple lock, leaving the cycle to the other
two, as it would be without us), and try again. Unless someone is waiting for a lock this
transaction took *before* the SAVEPOINT (``pg_blocking_pids``): then the cycle is the producer's own,
and the error is raised as it is.

**How long.** A wait lasts as long as the row's holder (and whoever queued for the row first:
PostgreSQL grants a row's waiters in arrival order), plus two round trips. The row waited for last is
kept share-locked while the write is tried again: a scheduler's next pass would otherwise take it again
before the retry. All waits of one write end by ``lock_wait_s`` (each wait's ``lock_timeout`` is the
time left): then :class:`~airflow_adrq.errors.LockWaitTimeoutError`, and the transaction fails.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from airflow_adrq import metrics, statement
from airflow_adrq.errorcodes import RetryableKind, classify
from airflow_adrq.errors import LockWaitTimeoutError
from airflow_adrq.statement import Form

__all__ = ["LOCK_WAIT_S", "write_once"]

#: How long, in all, a queue write may wait for busy consumer ``dag`` rows by default (seconds).
#: Longer than the DAG processor holds a large file's DAGs while it saves them.
LOCK_WAIT_S = 60.0

_SAVEPOINT = "adrq_share_lock"
_LOCK_TIMEOUT = text("SELECT current_setting('lock_timeout')")
_SET_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :value, true)")
#: Someone waits for a lock this session holds: taken before the SAVEPOINT, once it is rolled back to.
_WAITED_FOR = text(
    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND pg_backend_pid() = ANY (pg_blocking_pids(pid)))"
)
#: Errors a wait for one busy row may end with while the producer holds no ``dag`` row of its own.
_WAIT_ENDED = (RetryableKind.DEADLOCK, RetryableKind.LOCK_TIMEOUT)


def write_once(
    conn: Connection,
    form: Form,
    params: dict[str, Any],
    options: Mapping[str, Any],
    lock_wait_s: float = LOCK_WAIT_S,
) -> tuple[dt.datetime, int]:
    """The one-statement write (:func:`airflow_adrq.statement.write_once`); the stamp and rows written.

    Locks: the consumers' ``dag`` rows ``FOR SHARE`` (byte order, ``NOWAIT``), then as the statement.
    While a row is busy it waits for it holding none (module docstring), each round counted as
    ``queue_write.lock_waits``, each wait ended by someone else's deadlock or lock timeout as
    ``queue_write.wait_retries``. Leaves its SAVEPOINT open (it ends with the transaction) and the
    session's ``lock_timeout`` as it found it.

    Does not promise: an end before ``lock_wait_s`` (:class:`~airflow_adrq.errors.LockWaitTimeoutError`,
    which fails the transaction), or survival of a cycle through locks the transaction took before.
    """
    stmt = statement.write_once("postgresql", form)
    deadline = _Deadline(time.monotonic() + lock_wait_s, lock_wait_s)
    conn.exec_driver_sql(f"SAVEPOINT {_SAVEPOINT}")
    while True:
        try:
            result = conn.execute(stmt, params, execution_options=options)
        except DBAPIError as exc:
            if _ended_by(exc) is not RetryableKind.LOCK_TIMEOUT:
                raise
            metrics.report("incr", "queue_write.lock_waits", 1)
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            _wait_for_busy_rows(conn, form, params, options, deadline)
            continue
        # RETURNING: a row per event, each (the stamp, the queue rows written); at least one event.
        return cast(tuple[dt.datetime, int], result.first())


def _wait_for_busy_rows(
    conn: Connection,
    form: Form,
    params: dict[str, Any],
    options: Mapping[str, Any],
    deadline: _Deadline,
) -> None:
    """Wait, holding no ``dag`` row of ours, until each busy consumer row was released once.

    The last one stays locked: a scheduler's next pass would take it again before the retry.
    """
    wanted = set(conn.execute(statement.referencing_dags(form), params, execution_options=options).scalars())
    lock_free = statement.share_lock("postgresql", form, "skip_locked")
    busy = sorted(wanted - set(conn.execute(lock_free, params, execution_options=options).scalars()))
    conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    deadline.left_ms(busy)  # none left: raise, however often the rows changed hands
    if not busy:
        return
    previous = conn.execute(_LOCK_TIMEOUT).scalar_one()
    for n, dag_id in enumerate(busy, 1):
        try:
            conn.execute(_SET_LOCK_TIMEOUT, {"value": f"{deadline.left_ms([dag_id])}ms"})
            conn.execute(statement.ONE_DAG_SHARE_LOCK, {"dag_id": dag_id}, execution_options=options)
        except DBAPIError as exc:
            if _ended_by(exc) not in _WAIT_ENDED:
                raise
            # Back to the SAVEPOINT (its lock_timeout too): the tuple lock we were queued on goes.
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            if conn.execute(_WAITED_FOR).scalar_one():
                raise  # a cycle through what the transaction locked before: ours, not someone else's
            metrics.report("incr", "queue_write.wait_retries", 1)
            return
        if n < len(busy):
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    conn.execute(_SET_LOCK_TIMEOUT, {"value": previous})


class _Deadline(NamedTuple):
    """When a write's waits must have ended (``time.monotonic()``), and the setting that said so."""

    at: float
    lock_wait_s: float

    def left_ms(self, busy: Sequence[str]) -> int:
        """Milliseconds left to wait for the ``busy`` rows; :class:`LockWaitTimeoutError` if none."""
        left_ms = int((self.at - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise LockWaitTimeoutError(
                f"the queue write waited {self.lock_wait_s:g} s (lock_wait_s) for its consumers' dag rows; "
                f"busy at the end: {', '.join(map(repr, busy)) or 'none'} (pg_locks and pg_stat_activity "
                "tell who holds them)"
            )
        return left_ms


def _ended_by(exc: DBAPIError) -> RetryableKind | None:
    found = classify(exc)
    return found.kind if found is not None else None
