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

    SELECT target_dag_id, asset_id FROM asset_dag_run_queue JOIN (<the statement's pairs>) ...
     WHERE created_at < :stamp ORDER BY target_dag_id, asset_id       -- no locks
    -- then, per DAG, each in a transaction of its own:
    UPDATE asset_dag_run_queue SET created_at = :stamp
     WHERE target_dag_id = :dag AND asset_id IN (:asset_ids) AND created_at < :stamp

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Select, Table, bindparam, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from airflow_adrq.errorcodes import RetryableKind, classify
from airflow_adrq.models import AssetDagRunQueue, UtcDateTime
from airflow_adrq.txscope import TransactionScoped

__all__ = ["ATTEMPTS", "Planned", "after_commit"]

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
class Planned:
    """One refresh to run after the session's COMMIT: which rows (a SELECT, its parameters), which stamp."""

    connection: Connection
    older_rows: Select[Any]
    params: Mapping[str, Any]
    stamp: dt.datetime
    options: Mapping[str, Any] = field(default_factory=dict)


def _run(_session: Session, planned: list[Planned]) -> None:
    for item in planned:
        try:
            _refresh(item)
        except Exception:  # never fail a committed transaction's caller (a task's success call)
            log.warning("airflow-adrq: refreshing queue rows after COMMIT failed", exc_info=True)


_SCOPE: TransactionScoped[Planned] = TransactionScoped("refresh_after_commit", after_commit=_run)


def after_commit(session: Session, planned: Planned) -> None:
    """Run ``planned`` after the session's outermost COMMIT (dropped on rollback, as its events are).

    Locks nothing now. After COMMIT, on ``planned.connection``: per DAG one
    short transaction locking that DAG's rows in key order (see the module
    docstring). Skipped if the connection is still inside a transaction then
    (a session joined to an outer one), where a per-DAG transaction is not
    possible. Does not promise the refresh: it is best effort by design.
    """
    _SCOPE.add(session, planned)


def _refresh(item: Planned) -> None:
    conn = item.connection
    if conn.closed or conn.in_transaction():
        log.debug("airflow-adrq: no refresh after COMMIT: the connection is closed or in a transaction")
        return
    with conn.begin():
        params = {**item.params, "stamp": item.stamp}
        older = conn.execute(item.older_rows, params, execution_options=item.options)
        by_dag: dict[str, list[int]] = {}
        for dag_id, asset_id in older:
            by_dag.setdefault(dag_id, []).append(asset_id)
    for dag_id, asset_ids in by_dag.items():  # in the database's order of dag_id
        try:
            _one_dag(conn, dag_id, asset_ids, item)
        except DBAPIError:  # this DAG's rows wait for the next event; the others still get theirs
            log.warning("airflow-adrq: refreshing %s's queue rows after COMMIT failed", dag_id, exc_info=True)


def _one_dag(conn: Connection, dag_id: str, asset_ids: list[int], item: Planned) -> None:
    params = {"dag_id": dag_id, "asset_ids": asset_ids, "stamp": item.stamp}
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
