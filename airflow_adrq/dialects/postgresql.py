"""PostgreSQL: the queue write, in the order its statements are sent.

**What it sends**, in order (compiled, as a DBA reads them: ``docs/sql/postgresql.sql``, which
``tests/unit/test_sql_docs.py`` compares with these statements)::

    SAVEPOINT adrq_share_lock
    WITH ev       -- this transaction's events: asset_event WHERE id IN (:ids)
         src      -- their consumers, read once (MATERIALIZED): the four kinds of reference
         locked   -- every consumer's dag row FOR SHARE OF dag NOWAIT, ORDER BY dag_id COLLATE "C"
         stamp    -- clock_timestamp(), read once the locks are held
         queued   -- INSERT INTO asset_dag_run_queue ... ORDER BY asset_id, dag_id ON CONFLICT ...
    UPDATE asset_event SET timestamp = (SELECT stamp FROM stamp) WHERE id IN (:ids)
    RETURNING timestamp, (SELECT count(*) FROM queued)    -- (:func:`one_statement`)

    -- only if a consumer's dag row was busy (55P03):
    ROLLBACK TO SAVEPOINT adrq_share_lock
    SELECT dag_id ... (every consumer)            -- which rows are busy: the consumers ...
    SELECT dag_id ... FOR SHARE OF dag SKIP LOCKED  -- ... minus those free now
    ROLLBACK TO SAVEPOINT adrq_share_lock         -- holds no dag row of ours from here
    SELECT current_setting('lock_timeout')
    SELECT set_config('lock_timeout', '<ms left>ms', true)
    SELECT dag_id FROM dag WHERE dag_id = :dag_id FOR SHARE OF dag    -- the first busy row: waits for
    SELECT set_config('lock_timeout', '<as before>', true)           -- its holder, and keeps it
    -- then the statement above again

The event ids are its only parameter, bound twice (to read the events and to stamp them).

**Locks, in order.** Every consumer's ``dag`` row (paused or not, every kind of reference) ``FOR
SHARE``, in byte order (``COLLATE "C"``: the Sort node sits below LockRows), which Airflow's scheduler
skips (``FOR NO KEY UPDATE SKIP LOCKED``): no run is made over a window holding an event stamped and
not yet visible (GUARANTEES.md, "Timing"). Then the queue rows it inserts, and the existing ones it
moves forwards (``DO UPDATE`` locks them), in ``(asset_id, target_dag_id)`` order; the FK checks
take ``FOR KEY SHARE`` on the ``dag`` and ``asset`` parents, which producers share; then the
transaction's ``asset_event`` rows. ``ON CONFLICT DO NOTHING`` (``"ignore"``) does not lock a
committed conflicting row; it only waits for a transaction inserting the same key.

**The clock** is ``clock_timestamp()``, read once the share locks are held and before any queue row
is written; the events' ``timestamp`` and the rows' ``created_at`` get that one value.

**Never waiting while it holds a consumer's row.** Airflow's writers of ``dag`` lock rows in orders
of their own (the DAG processor's ``find_orm_dags ... FOR NO KEY UPDATE`` and its flushes, the
``UPDATE dag SET is_paused`` of ``PATCH /dags``, a scheduler's pass), so no order of ours matches them
all: the share locks are ``NOWAIT``, and a busy row is waited for alone, holding none. PostgreSQL
makes the first waiter for a row hold the row's *tuple lock*, so a cycle between two other writers
(the DAG processor waits for a bulk ``PATCH``, which waits for the row the producer is queued for)
runs through the producer, and as the oldest waiter its ``deadlock_timeout`` fires first: a wait
that ends in a deadlock (40P01) or lock timeout (55P03) goes back to the SAVEPOINT (which drops the
tuple lock, leaving the cycle to the other two) and waits again, unless someone waits for a lock the
transaction took before the SAVEPOINT (``pg_blocking_pids``: then the cycle is its own, and the error
is raised). A wait lasts as long as the row's holder (and whoever queued for the row first), plus two
round trips; then the statement is tried again at once, since the rows one transaction held are free
together when it ends (a wait per busy row, in turn, let a DAG processor saving its file back to back
take the next row first every time). The row waited for stays share-locked while the statement is
tried again: a scheduler's next pass would otherwise take it again first.

**Does not promise**: an end before ``lock_wait_s`` (:class:`~airflow_adrq.errors.LockWaitTimeoutError`:
the transaction fails), survival of a cycle through locks the transaction took before, or the
one-statement path past the bound-parameter limit (more than
:data:`~airflow_adrq.queue.IDS_PER_STATEMENT` events, or multi-team pairs): there the share locks are
taken blocking, in byte order, then the clock is read and the rows are written chunk by chunk.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

from sqlalchemy import ARRAY, ColumnElement, String, any_, bindparam, func, select, text
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, CursorResult, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.selectable import Select

from airflow_adrq import queue, statement, tables
from airflow_adrq.dialects import ConflictMode, on_conflict_insert_from_select
from airflow_adrq.errorcodes import RetryableKind, classify
from airflow_adrq.errors import LockWaitTimeoutError
from airflow_adrq.metrics import Metrics
from airflow_adrq.statement import Form
from airflow_adrq.tables import UtcDateTime

name = "postgresql"
#: PostgreSQL's default READ COMMITTED is what the guarantees assume: no engine settings.
engine_kwargs: Mapping[str, Any] = {}
driver_extra: str | None = "postgres"
stamp_in_one_statement = True
transactional_ddl = True

_DAG = tables.dag
_SAVEPOINT = "adrq_share_lock"


def clock() -> ColumnElement[dt.datetime]:
    """The start of the statement that reads it: one value for the whole statement."""
    return func.statement_timestamp(type_=UtcDateTime())


def configure_engine(engine: Engine) -> None:
    """Nothing: PostgreSQL's defaults are what the guarantees assume."""


def check_connection(connection: Connection) -> None:
    """Nothing to check."""


def check_before_ddl(connection: Connection) -> None:
    """Nothing to check."""


def refresh_by_default(connection: Connection) -> bool:
    """Airflow's scheduler locks the rows it consumes (``FOR UPDATE SKIP LOCKED``): refresh waits for it."""
    return True


def insert_from_select(
    table: Any,
    columns: Sequence[Any],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Any:
    """``INSERT ... SELECT ... ON CONFLICT (key) DO NOTHING`` or ``DO UPDATE SET refresh = greatest(...)``."""
    return on_conflict_insert_from_select(
        postgresql.insert, "greatest", table, columns, select, key, on_conflict, refresh
    )


def insert_ignore(table: Any) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING``."""
    return postgresql.insert(table).on_conflict_do_nothing()


def rows_written(connection: Connection, result: CursorResult[Any]) -> int:
    """The driver's rowcount."""
    return result.rowcount


def write(
    conn: Connection,
    form: Form,
    chunk_params: list[dict[str, Any]],
    options: Mapping[str, Any],
    lock_wait_s: float,
    metrics: Metrics,
) -> tuple[dt.datetime, int]:
    """The queue write as the module docstring sends it; the stamp and the rows written."""
    (one, *more) = chunk_params
    # The one statement binds the ids twice (and the multi-team pairs): within the limits?
    bound = 2 * len(one["ids"]) + len(one.get("restricted_ids", ())) + 2 * len(one.get("allowed", ()))
    if not more and bound <= queue.IDS_PER_STATEMENT:
        return _one_statement_never_waiting_while_holding(conn, form, one, options, lock_wait_s, metrics)
    for params in chunk_params:
        conn.execute(_share_lock(form), params, execution_options=options)
    return queue.stamp_then_insert(conn, form, chunk_params, options)


def _one_statement_never_waiting_while_holding(
    conn: Connection,
    form: Form,
    params: dict[str, Any],
    options: Mapping[str, Any],
    lock_wait_s: float,
    metrics: Metrics,
) -> tuple[dt.datetime, int]:
    stmt = one_statement(form)
    deadline = _Deadline(time.monotonic() + lock_wait_s, lock_wait_s)
    conn.exec_driver_sql(f"SAVEPOINT {_SAVEPOINT}")
    while True:
        try:
            result = conn.execute(stmt, params, execution_options=options)
        except DBAPIError as exc:
            if _ended_by(exc) is not RetryableKind.LOCK_TIMEOUT:
                raise
            metrics.incr("queue_write.lock_waits")
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            _wait_for_busy_rows(conn, form, params, options, deadline, metrics)
            continue
        # RETURNING: a row per event, each (the stamp, the queue rows written); at least one event.
        return cast(tuple[dt.datetime, int], result.first())


_LOCK_TIMEOUT = text("SELECT current_setting('lock_timeout')")
_SET_LOCK_TIMEOUT = text("SELECT set_config('lock_timeout', :value, true)")
#: Someone waits for a lock this session holds: taken before the SAVEPOINT, once it is rolled back to.
_WAITED_FOR = text(
    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND pg_backend_pid() = ANY (pg_blocking_pids(pid)))"
)
#: ``SELECT dag_id FROM dag WHERE dag_id = :dag_id FOR SHARE OF dag``: waits for one row's holder.
_ONE_DAG_SHARE_LOCK = (
    select(_DAG.c.dag_id).where(_DAG.c.dag_id == bindparam("dag_id")).with_for_update(read=True, of=_DAG)
)
#: Errors a wait for one busy row may end with while the producer holds no ``dag`` row of its own.
_WAIT_ENDED = (RetryableKind.DEADLOCK, RetryableKind.LOCK_TIMEOUT)


def _wait_for_busy_rows(
    conn: Connection,
    form: Form,
    params: dict[str, Any],
    options: Mapping[str, Any],
    deadline: _Deadline,
    metrics: Metrics,
) -> None:
    """Wait, holding no ``dag`` row of ours, for the first busy consumer row's holder; keep that row.

    One wait, then the statement again: rows held by one transaction (a scheduler's pass, the DAG
    processor's save of a file, a bulk ``PATCH``) are free together once it ends, and waiting for each of
    them in turn would let a writer that starts again (the DAG processor's next save) take the next one
    first, every time. The row stays share-locked, so a scheduler's next pass cannot take it back first.
    """
    wanted = set(conn.execute(statement.referencing_dags(form), params, execution_options=options).scalars())
    lock_free = _share_lock(form, "skip_locked")
    busy = sorted(wanted - set(conn.execute(lock_free, params, execution_options=options).scalars()))
    conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    left_ms = deadline.left_ms(busy)  # none left: raise, however often the rows changed hands
    if not busy:
        return
    previous = conn.execute(_LOCK_TIMEOUT).scalar_one()
    try:
        conn.execute(_SET_LOCK_TIMEOUT, {"value": f"{left_ms}ms"})
        conn.execute(_ONE_DAG_SHARE_LOCK, {"dag_id": busy[0]}, execution_options=options)
    except DBAPIError as exc:
        if _ended_by(exc) not in _WAIT_ENDED:
            raise
        # Back to the SAVEPOINT (its lock_timeout too): the tuple lock we were queued on goes.
        conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        if conn.execute(_WAITED_FOR).scalar_one():
            raise  # a cycle through what the transaction locked before: ours, not someone else's
        metrics.incr("queue_write.wait_retries")
        return
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


# --- the statements


def _in_consumers(src: Any) -> ColumnElement[bool]:
    """``dag.dag_id = ANY((SELECT array_agg(dag_id) FROM src))``.

    One array, so PostgreSQL probes ``dag``'s primary key once per consumer. ``dag_id IN (<subquery>)``
    is planned as a join, and the planner, which cannot know the events' assets, estimates the average
    fan-out: with a few thousand DAGs it hashes all of ``dag`` (a sequential scan) for an event with one
    consumer.
    """
    # The CAST makes the subquery one value (an array), not ANY's row source.
    consumers = sql_cast(select(func.array_agg(src.c.dag_id)).scalar_subquery(), ARRAY(String))
    return _DAG.c.dag_id == any_(consumers)


def _locking_read(in_consumers: ColumnElement[bool], wait: str) -> Select[Any]:
    """The consumers' ``dag`` rows ``FOR SHARE`` in byte order (how Python sorts the ids the DAG processor
    flushes: a database collated en_US.UTF-8 sorts 'B' after 'a', "C" before it)."""
    return (
        select(_DAG.c.dag_id)
        .where(in_consumers)
        .order_by(_DAG.c.dag_id.collate("C"))
        .with_for_update(read=True, of=_DAG, nowait=wait == "nowait", skip_locked=wait == "skip_locked")
    )


@functools.cache
def _share_lock(form: Form, wait: str = "wait") -> Select[Any]:
    """``SELECT dag_id FROM dag WHERE dag_id = ANY(<the consumers>) ORDER BY dag_id COLLATE "C" FOR SHARE``.

    ``wait``: block, or leave the busy rows out (``"skip_locked"``).
    """
    return _locking_read(_in_consumers(statement.form_consumers(form).subquery("src")), wait)


@functools.cache
def one_statement(form: Form) -> Update:
    """The whole queue write as ONE statement (the SQL is in the module docstring).

    ``stamp`` is read only after ``count(*)`` has read (so locked) every consumer row. The INSERT reads
    the consumers' ``dag`` columns by the same primary-key probe as the lock (``= ANY(<array>)``), never
    by joining the two CTEs: PostgreSQL has no statistics for a CTE and plans that join from the average
    fan-out, and with a small average a popular asset's join became a nested loop over both (1,024
    consumers: a million comparisons, 230 ms of a 290 ms statement).
    """
    src = statement.form_consumers(form).cte("src").prefix_with("MATERIALIZED")
    locked = _locking_read(_in_consumers(src), "nowait").cte("locked").prefix_with("MATERIALIZED")
    held = select(func.count().label("rows")).select_from(locked).subquery("held")
    # The wall clock when it is evaluated: here, after the share locks (statement_timestamp() is before).
    now = func.clock_timestamp(type_=UtcDateTime())
    stamp = select(now.label("stamp")).select_from(held).cte("stamp").prefix_with("MATERIALIZED")
    rows = statement.wanted(form, src).where(_in_consumers(src))
    at_stamp = select(stamp.c.stamp).scalar_subquery()
    written = statement.insert_of(name, form, at_stamp, rows)
    queued = written.returning(written.table.c.asset_id).cte("queued")
    # RETURNING, per event: the stamp, and the queue rows inserted or moved forwards (one count).
    count = select(func.count()).select_from(queued).scalar_subquery()
    events = tables.asset_event
    return (
        statement.stamped_events(at_stamp)
        .returning(events.c.timestamp, count)
        .add_cte(src, locked, stamp, queued)
    )
