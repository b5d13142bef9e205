"""``on_conflict="refresh_after_commit"``: existing queue rows moved forwards after COMMIT, DAG by DAG.

Where Airflow's scheduler takes no row locks (MariaDB, whose dialect has no
``FOR UPDATE OF``; any backend with ``[scheduler] use_row_level_locking =
False``), it reads a DAG's queue rows plainly and deletes them, DAG by DAG in
Python-set order, in one transaction. A producer refreshing existing rows in
its own transaction would lock them in key order across DAGs, and the two
deadlock. So there the queue statement leaves existing rows alone, as
Airflow's ``DO NOTHING`` does, and once the producer has committed, this
module gives the rows its events should have refreshed the transaction's
stamp::

    -- in the producer's transaction, once it is stamped, just before COMMIT:
    SELECT target_dag_id, asset_id FROM asset_dag_run_queue JOIN (<the statement's pairs>) ...
     WHERE created_at < :stamp ORDER BY target_dag_id, asset_id       -- no locks
    -- after COMMIT, only if it found rows, per DAG, each in a transaction of its own:
    UPDATE asset_dag_run_queue SET created_at = :stamp
     WHERE target_dag_id = :dag AND asset_id IN (:asset_ids) AND created_at < :stamp

Reading the rows before COMMIT finds those a read after it would, plus
rows consumed in between (their UPDATE then matches nothing): every row
of the statement's pairs that is not the producer's own already exists,
committed, once the statement ran (it waited for any producer inserting the
same pair), and what happens to such a row later is guarded by the UPDATE's
``created_at < :stamp``. The usual event, whose rows are all new, costs one
lock-free SELECT and nothing after COMMIT.

Why this cannot deadlock, lose or double an event:

* Each UPDATE locks rows of one DAG only, in primary-key order, as the
  scheduler's ``DELETE`` of that DAG does, and holds nothing else while it
  waits: it cannot be part of a cycle.
* Forwards only, never an INSERT: a row the scheduler deleted in between was
  consumed, and re-creating it would make a second run over the same window.
* The events are committed before any of this starts; a refresh that does not
  happen (the row was being consumed, the connection broke, the retries ran
  out) leaves the event waiting for its asset's next event, as Airflow's own
  ``DO NOTHING`` would. Nothing here raises: failures are logged.

It runs on the session's own connection, after COMMIT and before the session
hands the connection back to its pool (SQLAlchemy's ``after_commit``): no
second connection per transaction.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Select, Table, bindparam, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from airflow_adrq.errorcodes import RetryableKind, classify
from airflow_adrq.models import AssetDagRunQueue, UtcDateTime
from airflow_adrq.txscope import TransactionScoped

__all__ = ["ATTEMPTS", "plan"]

log = logging.getLogger(__name__)

#: Attempts per DAG statement on a deadlock or lock timeout.
ATTEMPTS = 3

_ADRQ = cast(Table, AssetDagRunQueue.__table__)
_ONE_DAG = (
    update(_ADRQ)
    .where(
        _ADRQ.c.target_dag_id == bindparam("dag_id"),
        _ADRQ.c.asset_id.in_(bindparam("asset_ids", expanding=True)),
        _ADRQ.c.created_at < bindparam("stamp", type_=UtcDateTime()),
    )
    .values(created_at=bindparam("stamp", type_=UtcDateTime()))
)


@dataclass(frozen=True)
class _Planned:
    """One refresh to run after the session's COMMIT: which rows of which DAG, which stamp."""

    connection: Connection
    #: dag_id -> the asset ids of its rows (in the database's order within one SELECT; past
    #: IDS_PER_STATEMENT events several SELECTs, so not one global order: none is needed).
    rows: Mapping[str, Sequence[int]]
    stamp: dt.datetime
    options: Mapping[str, Any] = field(default_factory=dict)


def _run(_session: Session, planned: list[_Planned]) -> None:
    for item in planned:
        try:
            _refresh(item)
        except Exception:  # never fail a committed transaction's caller (a task's success call)
            log.warning("airflow-adrq: refreshing queue rows after COMMIT failed", exc_info=True)


_SCOPE: TransactionScoped[_Planned] = TransactionScoped("refresh_after_commit", after_commit=_run)


def plan(
    session: Session,
    connection: Connection,
    older_rows: Select[Any],
    params: Sequence[Mapping[str, Any]],
    stamp: dt.datetime,
    options: Mapping[str, Any],
) -> None:
    """Find the rows to refresh now (``older_rows``, once per ``params``); refresh them after COMMIT.

    Locks nothing now: one plain SELECT per parameter set, in the caller's
    (stamped) transaction. After the session's outermost COMMIT, on
    ``connection``: per DAG one short transaction locking that DAG's rows in
    key order (see the module docstring); dropped on rollback, as its events
    are. Skipped if the connection is still inside a transaction then (a
    session joined to an outer one), where a per-DAG transaction is not
    possible. Does not promise the refresh: it is best effort by design.
    """
    rows: dict[str, list[int]] = {}
    for one in params:
        for dag_id, asset_id in connection.execute(
            older_rows, {**one, "stamp": stamp}, execution_options=options
        ):
            rows.setdefault(dag_id, []).append(asset_id)
    if rows:
        _SCOPE.add(session, _Planned(connection, rows, stamp, options))


def _refresh(item: _Planned) -> None:
    conn = item.connection
    if conn.closed or conn.in_transaction():
        log.debug("airflow-adrq: no refresh after COMMIT: the connection is closed or in a transaction")
        return
    # Each DAG is a transaction of its own, so the order across DAGs cannot form a lock cycle.
    for dag_id, asset_ids in item.rows.items():
        try:
            _one_dag(conn, dag_id, asset_ids, item)
        except DBAPIError:  # this DAG's rows wait for the next event; the others still get theirs
            log.warning("airflow-adrq: refreshing %s's queue rows after COMMIT failed", dag_id, exc_info=True)


def _one_dag(conn: Connection, dag_id: str, asset_ids: Sequence[int], item: _Planned) -> None:
    params = {"dag_id": dag_id, "asset_ids": list(asset_ids), "stamp": item.stamp}
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with conn.begin():
                conn.execute(_ONE_DAG, params, execution_options=item.options)
            return
        except DBAPIError as exc:
            if attempt == ATTEMPTS or not _transient(exc):
                raise
            time.sleep(random.uniform(0.005, 0.05) * attempt)


def _transient(exc: SQLAlchemyError) -> bool:
    found = classify(exc)
    return found is not None and found.kind in (RetryableKind.DEADLOCK, RetryableKind.LOCK_TIMEOUT)
