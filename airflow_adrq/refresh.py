"""Where the scheduler takes no row locks: the write without a ``dag`` lock, and the refresh.

Such a scheduler (MariaDB, whose dialect has no ``FOR UPDATE OF``; any backend with
``[scheduler] use_row_level_locking = False``) reads a DAG's queue rows plainly and deletes them, DAG by
DAG in Python-set order, in one transaction. A producer refreshing existing rows by waiting for their
locks would lock them in key order across DAGs, and the two deadlock. So there the statement leaves
existing rows alone (Airflow's ``DO NOTHING``; ``on_conflict="refresh_after_commit"``) and this module
moves the rows its events should have refreshed to the transaction's stamp, taking only rows no one
holds::

    -- in the producer's transaction, once it is stamped, as its last statements before COMMIT:
    SELECT target_dag_id, asset_id FROM asset_dag_run_queue JOIN (<the statement's pairs>) ...
     WHERE created_at < :stamp                                        -- no locks
    -- only if it found rows, per asset:
    SELECT target_dag_id FROM asset_dag_run_queue
     WHERE asset_id = :of_asset AND target_dag_id IN (:dag_ids) AND created_at < :stamp
       FOR UPDATE SKIP LOCKED
    UPDATE asset_dag_run_queue SET created_at = :stamp
     WHERE asset_id = :of_asset AND target_dag_id IN (<the rows it locked>) AND created_at < :stamp
    -- only if it skipped rows: which of them are still older (no locks), and
    -- after COMMIT, ONE short transaction doing the same for those

and, for rows skipped again, the same a few milliseconds later, up to :data:`ROUNDS` times. Rows moved
before COMMIT become visible with the events, as a refresh inside the statement would make them; the
usual event, whose rows are all new, costs the one lock-free SELECT. It finds every row of the
statement's pairs that is not the producer's own: it exists, committed, once the statement ran (that
waited for any producer inserting the same pair), and what happens to it later is guarded by
``created_at < :stamp``.

Why this cannot deadlock the producer, lose or double an event:

* It never waits for a row lock: ``SKIP LOCKED`` leaves out the rows a scheduler is deleting or another
  producer is refreshing, and the UPDATE touches only rows it holds (a primary-key range: ``asset_id``
  and a ``dag_id`` list). Before COMMIT these are the transaction's last statements, after it a
  transaction of their own: waiting for nothing once it holds these rows, it closes no cycle through
  them. A row the scheduler held is gone once it commits (consumed); one another producer held is tried
  again after COMMIT. (InnoDB was once seen to pick the after-COMMIT read as a deadlock victim under a
  scheduler taking no row locks, about 1 in 500 commits in
  ``tests/concurrency/test_scheduler_deletes.py``: the producer had committed; the failure is logged and
  counted, as below.)
* Forwards only, never an INSERT: a row the scheduler deleted in between was consumed, and re-creating
  it would make a second run over the same window.
* A refresh that does not happen (locked for every round, the connection broken after COMMIT) leaves the
  event waiting for its asset's next event, as Airflow's ``DO NOTHING`` would. Nothing after COMMIT
  raises: failures are logged and counted.

The part after COMMIT runs on the session's own connection before the session returns it to its pool
(SQLAlchemy's ``after_commit``): no second connection per transaction. It needs ``SKIP LOCKED`` (MariaDB
10.6, MySQL 8.0, PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import Select, bindparam, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Update

from airflow_adrq import dialects, queue, statement
from airflow_adrq.metrics import Metrics
from airflow_adrq.tables import UtcDateTime, asset_dag_run_queue
from airflow_adrq.txscope import TransactionScoped

__all__ = ["PENDING", "ROUNDS", "write_then_stamp"]

log = logging.getLogger(__name__)

#: Rounds of the after-COMMIT transaction for rows another transaction held.
ROUNDS = 3

_ADRQ = asset_dag_run_queue
_STAMP = bindparam("stamp", type_=UtcDateTime())
_OLDER = (
    _ADRQ.c.asset_id == bindparam("of_asset"),
    _ADRQ.c.target_dag_id.in_(bindparam("dag_ids", expanding=True)),
    _ADRQ.c.created_at < _STAMP,
)
_STILL_OLDER = select(_ADRQ.c.target_dag_id).where(*_OLDER)
_LOCK_OLDER = _STILL_OLDER.with_for_update(skip_locked=True)
# InnoDB would take the UPDATE through the target_dag_id index: a range over
# every asset's rows of those DAGs, locking (and waiting for) rows this
# transaction does not hold. The primary key reaches exactly the held rows.
_MOVE_FORWARDS = (
    update(_ADRQ)
    .where(*_OLDER)
    .values(created_at=_STAMP)
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql")
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mariadb")
)


#: The ``created_at`` of the queue rows this transaction inserted, between the two steps of
#: :func:`write_then_stamp`: a value no real stamp has, inside every backend's range (MySQL's
#: TIMESTAMP ends in January 2038), by which step 2 finds its own new rows (the statement leaves
#: existing rows alone on this path: ``DO NOTHING``). Step 2 replaces it with the stamp in the same
#: transaction, before COMMIT can be sent: no other transaction ever reads it.
PENDING: Final = dt.datetime(2038, 1, 1, tzinfo=dt.timezone.utc)


def _pending_rows(stamp: Any) -> Update:
    # The rows step 1 inserted or took, and no one else's: another
    # transaction's PENDING rows are uncommitted, so invisible here (READ
    # COMMITTED reads their committed version, which carries a real stamp).
    return (
        update(_ADRQ)
        .where(
            _ADRQ.c.asset_id.in_(bindparam("asset_ids", expanding=True)),
            _ADRQ.c.created_at == bindparam("pending", type_=UtcDateTime()),
        )
        .values(created_at=stamp)
    )


_STAMP_ROWS: Update = _pending_rows(_STAMP)


@functools.cache
def _stamp_in_one_statement(dialect_name: str) -> Select[Any]:
    """``WITH e AS (UPDATE asset_event ...), q AS (UPDATE asset_dag_run_queue ...) SELECT <clock>``.

    Data-modifying CTEs (PostgreSQL): one round trip, and the statement's clock is one value.
    """
    clock = dialects.get(dialect_name).clock
    assert clock is not None
    now = clock()
    events = statement.stamped_events(now).cte("stamped_events")
    rows = _pending_rows(now).cte("stamped_rows")
    return select(now).add_cte(events, rows)


def write_then_stamp(
    bind: Session | Connection,
    conn: Connection,
    form: statement.Form,
    chunk_params: list[dict[str, Any]],
    asset_ids: list[int],
    options: Mapping[str, Any],
    metrics: Metrics,
) -> tuple[dt.datetime, int]:
    """Without the ``dag`` lock: the rows at :data:`PENDING`, then one stamp on them and the events.

    Stamped once the queue rows are locked, so that producers sharing a row are stamped in the order
    they commit. Then, in a ``Session``, the older rows of the statement's pairs are moved forwards as
    the module docstring says: now those no one holds (locked ``FOR UPDATE SKIP LOCKED`` until the
    COMMIT that comes next: no cycle), the others after the outermost COMMIT, on ``conn`` (dropped on
    rollback, as the events are; skipped if ``conn`` is then still in a transaction, a session joined to
    an outer one). Does not promise the refresh of a held row: it is best effort by design. Returns the
    stamp and the rows the statement wrote (the refresh's rows are counted on ``metrics`` as
    ``refresh.rows``).
    """
    backend = dialects.get(conn)
    stmt = statement.insert_statement(backend.name, form)
    written = 0
    for params in chunk_params:
        result = conn.execute(stmt, {**params, "created_at": PENDING}, execution_options=options)
        written += backend.rows_written(conn, result)
    ids = [event_id for params in chunk_params for event_id in params["ids"]]
    if backend.stamp_in_one_statement and len(ids) <= queue.IDS_PER_STATEMENT:
        params = {"ids": ids, "asset_ids": asset_ids, "pending": PENDING}
        one_statement = _stamp_in_one_statement(backend.name)
        stamp: dt.datetime = conn.execute(one_statement, params, execution_options=options).scalar_one()
    else:
        # One clock reading, then as many statements as the bound-parameter limits need.
        stamp = queue.clock_on_events(conn, ids, options)
        for start in range(0, len(asset_ids), queue.IDS_PER_STATEMENT):
            chunk = asset_ids[start : start + queue.IDS_PER_STATEMENT]
            params = {"asset_ids": chunk, "stamp": stamp, "pending": PENDING}
            conn.execute(_STAMP_ROWS, params, execution_options=options)
    if form.shape.event_keyed or not isinstance(bind, Session):
        return stamp, written
    rows: dict[int, list[str]] = {}
    for params in chunk_params:
        older = conn.execute(_older_rows(form), {**params, "stamp": stamp}, execution_options=options)
        for dag_id, asset_id in older:
            rows.setdefault(asset_id, []).append(dag_id)
    if rows:
        todo = _move_forwards(conn, rows, stamp, options)
        metrics.incr("refresh.rows", sum(map(len, rows.values())) - sum(map(len, todo.values())))
        if todo:
            _SCOPE.add(bind, (functools.partial(_refresh, conn, todo, stamp, options), metrics))
    return stamp, written


def _run(_session: Session, refreshes: list[tuple[Callable[[], int], Metrics]]) -> None:
    for refresh, metrics in refreshes:
        metrics.incr("refresh_after_commit")
        try:
            moved = refresh()
        except Exception:  # never fail a committed transaction's caller (a task's success call)
            metrics.incr("refresh_after_commit.failures")
            log.warning("airflow-adrq: refreshing queue rows after COMMIT failed", exc_info=True)
        else:
            metrics.incr("refresh_after_commit.rows", moved)


#: The refreshes to run after the session's COMMIT, each returning the rows it moved, and where to count.
_SCOPE: TransactionScoped[tuple[Callable[[], int], Metrics]] = TransactionScoped(
    "refresh_after_commit", after_commit=_run
)


@functools.cache
def _older_rows(form: statement.Form) -> Select[Any]:
    """``SELECT target_dag_id, asset_id`` of the rows ``form`` queues older than ``:stamp`` (unordered)."""
    wanted = statement.wanted(form).subquery("wanted")
    return (
        select(_ADRQ.c.target_dag_id, _ADRQ.c.asset_id)
        .join(wanted, (wanted.c.asset_id == _ADRQ.c.asset_id) & (wanted.c.dag_id == _ADRQ.c.target_dag_id))
        .where(_ADRQ.c.created_at < _STAMP)
    )


def _refresh(
    conn: Connection, rows: Mapping[int, Sequence[str]], stamp: dt.datetime, options: Mapping[str, Any]
) -> int:
    """The rounds of one refresh after COMMIT, each a transaction of :func:`_move_forwards`; the rows moved.

    ``rows``: asset_id -> the DAG ids of its rows to move forwards (in no order: nothing waits).
    """
    if conn.closed or conn.in_transaction():
        log.debug("airflow-adrq: no refresh after COMMIT: the connection is closed or in a transaction")
        return 0
    todo = {asset_id: list(dag_ids) for asset_id, dag_ids in rows.items()}
    moved = 0
    for round_ in range(1, ROUNDS + 1):
        if round_ > 1:
            # The rows skipped are held by a short transaction (another refresh: three round
            # trips) or by a scheduler consuming them: a few milliseconds is enough.
            time.sleep(random.uniform(0.001, 0.003) * round_)
        before = sum(map(len, todo.values()))
        with conn.begin():
            todo = _move_forwards(conn, todo, stamp, options)
        # (Rows left out that were consumed meanwhile count as moved: they need nothing more.)
        moved += before - sum(map(len, todo.values()))
        if not todo:
            return moved
    log.debug(
        "airflow-adrq: %d queue rows stayed locked for every refresh round", sum(map(len, todo.values()))
    )
    return moved


def _move_forwards(
    conn: Connection, todo: Mapping[int, Sequence[str]], stamp: dt.datetime, options: Mapping[str, Any]
) -> dict[int, list[str]]:
    """Per asset of ``todo``: lock the rows no one holds, move them forwards; return the rest still older."""
    skipped: dict[int, list[str]] = {}
    for asset_id, dag_ids in todo.items():
        params = {"of_asset": asset_id, "dag_ids": list(dag_ids), "stamp": stamp}
        held = set(conn.execute(_LOCK_OLDER, params, execution_options=options).scalars())
        if held:
            conn.execute(_MOVE_FORWARDS, {**params, "dag_ids": sorted(held)}, execution_options=options)
        left = [dag_id for dag_id in dag_ids if dag_id not in held]
        if left:
            # Left out: locked by someone, or consumed / moved on already. Only
            # those still older (as last committed) are worth another round.
            still = conn.execute(_STILL_OLDER, {**params, "dag_ids": left}, execution_options=options)
            skipped_here = sorted(set(still.scalars()))
            if skipped_here:
                skipped[asset_id] = skipped_here
    return skipped
