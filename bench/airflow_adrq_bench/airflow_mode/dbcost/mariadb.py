"""MariaDB's (InnoDB's) counters of one cell, read by the controller around the task successes.

PostgreSQL's figures have no InnoDB counterpart as such: a transaction takes one transaction id whatever
its SAVEPOINTs (a SAVEPOINT is a marker in the transaction's undo log, not a transaction), row locks live
in memory (no MultiXacts, nothing written for a lock) and pages are not imaged at a checkpoint (the
doublewrite buffer is written when pages are flushed, not per change). What applies, read on a
throwaway server of its own (:data:`SETTINGS`: no statistics recalculation, no adaptive flushing):

* **Redo bytes**: the ``Innodb_lsn_current`` delta, once purge has caught up on each side (the purge of
  the cell's own undo is counted: it is what its deletes and updates cost later).
* **Transaction ids**: the ``Trx id counter`` delta of ``SHOW ENGINE INNODB STATUS`` (InnoDB draws a
  read-write transaction's id and its commit number from that one counter: about 2 per transaction).
* **InnoDB monitors** (``information_schema.INNODB_METRICS``, all enabled): read-write commits, rollbacks
  to a savepoint, record lock requests, row lock waits, deadlocks.
* **Handler counters** (``SHOW GLOBAL STATUS``): rows written, updated and deleted; savepoints set,
  released and rolled back to.
* **Pages dirtied**: every page is flushed before the cell (``innodb_max_dirty_pages_pct`` 0 until
  none is dirty); the pages ``INNODB_BUFFER_PAGE`` shows modified after it, per table (pages of no
  table under their page type: ``SYSTEM`` are mostly the 128 rollback segment headers, ``UNDO_LOG`` undo
  pages). ``buffer_pages_written`` during the cell says if any was flushed early.
* **Per statement** (one caller only): the worker reads ``Innodb_lsn_current`` on a connection of its
  own before and after every statement it sends (:class:`.success.RedoProbe`); what the call wrote
  outside its statements is its COMMIT's, and what the next purge wait adds, purge's.
"""

from __future__ import annotations

import re
import time
from typing import Any, NamedTuple

import sqlalchemy as sa

SETTINGS = {
    "innodb-monitor-enable": "all",
    # Nothing but the cells writes: no statistics recalculation, no flushing the cell would not cause.
    "innodb-stats-auto-recalc": "OFF",
    "innodb-adaptive-flushing": "OFF",
    "innodb-max-dirty-pages-pct-lwm": "0",
    "innodb-log-file-size": "1G",
    "innodb-buffer-pool-size": "512M",
}

#: The ``table`` of the pages of no table (rollback segment headers, undo, file space pages ...).
NO_TABLE = "(undo, system)"
_METRICS = (
    "trx_rw_commits",
    "trx_rollbacks_savepoint",
    "lock_rec_lock_requests",
    "lock_row_lock_waits",
    "lock_deadlocks",
    "buffer_pages_written",
)
_STATUS = (
    "Innodb_lsn_current",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
    "Handler_savepoint",
    "Handler_savepoint_rollback",
    "Com_savepoint",
    "Com_release_savepoint",
    "Com_rollback_to_savepoint",
)


class Mark(NamedTuple):
    """Where the server is: every counter this module reads (``lsn`` first)."""

    counters: dict[str, int]


def prepare(engine: sa.Engine) -> None:
    """Nothing: the monitors are enabled at the server's start."""


def settle(engine: sa.Engine) -> None:
    """Nothing: each cell waits for purge and flushes every page as it opens."""


def open_cell(engine: sa.Engine) -> dict[str, Any]:
    """Purge caught up and every page flushed; where the cell starts."""
    with engine.connect() as conn:
        _purged(conn)
        conn.exec_driver_sql("SET GLOBAL innodb_max_dirty_pages_pct = 0")
        try:
            deadline = time.monotonic() + 120
            while _status(conn, "Innodb_buffer_pool_pages_dirty") and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            conn.exec_driver_sql("SET GLOBAL innodb_max_dirty_pages_pct = 90")
        return {"mark": mark(conn)}


def mark(conn: sa.Connection) -> Mark:
    """Every counter, once purge has caught up."""
    _purged(conn)
    status: dict[str, Any] = dict(
        conn.exec_driver_sql(
            "SELECT variable_name, variable_value FROM information_schema.global_status "
            f"WHERE variable_name IN ({', '.join(repr(s.upper()) for s in _STATUS)})"
        ).all()
    )
    metrics: dict[str, Any] = dict(
        conn.exec_driver_sql(
            "SELECT name, count FROM information_schema.innodb_metrics "
            f"WHERE name IN ({', '.join(map(repr, _METRICS))})"
        ).all()
    )
    counters = {name: int(status.get(name.upper(), 0)) for name in _STATUS}
    counters |= {name: int(metrics.get(name, 0)) for name in _METRICS}
    return Mark(counters | {"trx_ids": _trx_id_counter(conn)})


def between(conn: sa.Connection, start: Mark, end: Mark) -> dict[str, Any]:
    """The counters' deltas (``end`` read once purge had caught up: :func:`mark`)."""
    delta = {k: end.counters[k] - start.counters[k] for k in end.counters}
    return {"redo_bytes": delta.pop("Innodb_lsn_current"), **delta}


def close_cell(engine: sa.Engine, opened: dict[str, Any]) -> dict[str, Any]:
    """Everything the cell cost since :func:`open_cell`, purge included."""
    with engine.connect() as conn:
        end = mark(conn)
        dirty = [
            {"relation": str(index or kind), "table": _table(table) or NO_TABLE, "pages": int(n)}
            for table, index, kind, n in conn.exec_driver_sql(_DIRTY)
        ]
        totals = between(conn, opened["mark"], end)
    return {"totals": totals, "dirty": dirty}


def _table(name: str | None) -> str:
    r"""``dag`` of ``\`adrq_bench_x\`.\`dag\```; empty for a page of no table."""
    return str(name).rpartition(".")[2].strip("`") if name else ""


def _status(conn: sa.Connection, name: str) -> int:
    row = conn.exec_driver_sql(f"SHOW GLOBAL STATUS LIKE '{name}'").one()
    return int(row[1])


def _innodb_status(conn: sa.Connection) -> str:
    return str(conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").one()[2])


def _trx_id_counter(conn: sa.Connection) -> int:
    found = re.search(r"Trx id counter (\d+)", _innodb_status(conn))
    return int(found[1]) if found else 0


def _purged(conn: sa.Connection, timeout_s: float = 60.0) -> None:
    """Wait until InnoDB's history list is empty (or ``timeout_s``): purge has caught up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"History list length (\d+)", _innodb_status(conn))
        if not found or int(found[1]) == 0:
            return
        time.sleep(0.1)


_DIRTY = (
    "SELECT table_name, index_name, page_type, count(*) FROM information_schema.innodb_buffer_page "
    "WHERE oldest_modification > 0 GROUP BY table_name, index_name, page_type ORDER BY 4 DESC"
)
