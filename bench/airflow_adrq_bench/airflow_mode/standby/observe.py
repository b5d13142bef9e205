"""What is measured on the standby during a phase: the scheduler's reads, its wait events, its SLRUs.

:class:`Observers` runs, in threads of the controller (each with a session of its own on the
standby), ``readers`` loops of :data:`PASS` (the reads of a scheduler pass that ``FOR UPDATE``
aside can run on a standby) and one sampler of ``pg_stat_activity``; :func:`slru` reads
``pg_stat_slru`` (each reader's session ends with its phase, and a session that ends flushes its
statistics: the counters then hold all of the phase's reads)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq_bench.airflow_mode.databases import fetch

#: One scheduler pass, as Airflow 3.3.2 reads (``airflow/models/dag.py`` ``dags_needing_dagruns``, then
#: ``SchedulerJobRunner._create_dag_runs_asset_triggered``), in one transaction:
#: ``adrq``: every queue row with its DAG and asset (the ``joinedload`` of both);
#: ``dags``: the DAGs due (the standby refuses its ``FOR UPDATE SKIP LOCKED``: left out);
#: ``events``: one consumer DAG's events since its previous run (``:since``: a consume interval ago).
PASS: Final = {
    "adrq": """
SELECT q.*, d.*, a.*
FROM asset_dag_run_queue q
LEFT OUTER JOIN dag d ON d.dag_id = q.target_dag_id
LEFT OUTER JOIN asset a ON a.id = q.asset_id""",
    "dags": """
SELECT dag.* FROM dag
WHERE NOT dag.is_paused AND NOT dag.is_stale AND NOT dag.has_import_errors
  AND NOT dag.exceeds_max_non_backfill
  AND (dag.next_dagrun_create_after <= now() OR dag.dag_id IN :dag_ids)
ORDER BY dag.next_dagrun_create_after
LIMIT 10""",
    "events": """
SELECT e.* FROM asset_event e
WHERE e.asset_id IN (SELECT r.asset_id FROM dag_schedule_asset_reference r WHERE r.dag_id = :dag_id)
  AND e.timestamp <= now() AND e.timestamp > :since
ORDER BY e.timestamp, e.id""",
}

#: Wait events of every other session and process of the standby, those not idle: ``Activity`` (a
#: process's main loop, e.g. the startup process waiting for WAL) and ``Client`` (waiting for its
#: client) are idle. LWLock ``SubtransSLRU`` / ``SubtransBuffer`` and IO ``SLRURead`` are the stall.
_WAITS = """
SELECT backend_type, wait_event_type, wait_event, count(*)
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND wait_event_type NOT IN ('Activity', 'Client')
GROUP BY 1, 2, 3"""

_SLRU = """
SELECT name, blks_zeroed, blks_hit, blks_read, blks_written, blks_exists, flushes, truncates
FROM pg_stat_slru"""


def slru(conn: sa.Connection) -> dict[str, dict[str, int]]:
    """``pg_stat_slru`` now, per SLRU (``Subtrans``, ``Xact`` ...): its counters."""
    conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")  # the current counters, not a cached copy
    rows = conn.exec_driver_sql(_SLRU).mappings()
    return {str(row["name"]): {k: int(v) for k, v in row.items() if k != "name"} for row in rows}


#: The queue table's row versions written so far (on the primary): each insert and update leaves a
#: version that standby readers scan until a VACUUM may remove it, which the open transaction forbids.
_QUEUE_VERSIONS = """
SELECT n_tup_ins AS inserted, n_tup_upd AS updated, n_tup_del AS deleted, n_dead_tup AS dead
FROM pg_stat_user_tables WHERE relname = 'asset_dag_run_queue'"""


def queue_versions(conn: sa.Connection) -> dict[str, int]:
    """``asset_dag_run_queue``'s rows inserted, updated, deleted so far and dead now (statistics)."""
    conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
    row = conn.exec_driver_sql(_QUEUE_VERSIONS).mappings().one()
    return {k: int(v) for k, v in row.items()}


def slru_delta(
    after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per SLRU, each counter's increase from ``before`` to ``after``."""
    return {
        name: {k: v - before.get(name, {}).get(k, 0) for k, v in counters.items()}
        for name, counters in after.items()
    }


@dataclass
class Observed:
    """One phase's observations: per query (and ``pass``) the latencies in ms; wait-event samples."""

    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    queue_rows_seen: int = 0  # the most queue rows one pass read
    errors: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    waits: Counter[tuple[str, str, str]] = field(default_factory=Counter)


class Observers:
    """The readers and the sampler of one phase: :meth:`start`, then :meth:`stop` (returns them)."""

    def __init__(self, url: str, dag_ids: Sequence[str], *, readers: int, pause_s: float, sample_s: float):
        self.url, self.dag_ids, self.readers = url, list(dag_ids), readers
        self.pause_s, self.sample_s, self.window = pause_s, sample_s, dt.timedelta(seconds=1)
        self.stopping = threading.Event()
        self.observed = Observed(latencies_ms={name: [] for name in [*PASS, "pass"]})
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, window_s: float) -> None:
        """Start the readers (``window_s``: the events' window) and the sampler."""
        self.window = dt.timedelta(seconds=window_s)
        self.threads = [
            threading.Thread(target=self._read, args=(n,), daemon=True) for n in range(self.readers)
        ]
        self.threads.append(threading.Thread(target=self._sample, daemon=True))
        for thread in self.threads:
            thread.start()

    def stop(self) -> Observed:
        """Stop them; once this returns, every reader's session has ended (its statistics flushed)."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)
        return self.observed

    def _engine(self) -> sa.Engine:
        return sa.create_engine(self.url, poolclass=NullPool)

    def _read(self, reader: int) -> None:
        engine, n = self._engine(), reader
        mine: dict[str, list[float]] = {name: [] for name in self.observed.latencies_ms}
        most, errors = 0, Counter[str]()
        try:
            with engine.connect() as conn:
                while not self.stopping.is_set():
                    dag_id = self.dag_ids[n % len(self.dag_ids)]
                    n += self.readers  # readers take the consumers in turn, each a different one
                    began = time.perf_counter()
                    try:
                        most = max(most, self._one_pass(conn, dag_id, mine))
                    except sa.exc.DBAPIError as exc:  # e.g. canceled by a replay conflict: counted
                        errors[type(exc.orig).__name__] += 1
                        conn.rollback()
                        continue
                    mine["pass"].append((time.perf_counter() - began) * 1000)
                    self.stopping.wait(self.pause_s)
        finally:
            engine.dispose()
            with self.lock:
                for name, values in mine.items():
                    self.observed.latencies_ms[name].extend(values)
                self.observed.queue_rows_seen = max(self.observed.queue_rows_seen, most)
                self.observed.errors.update(errors)

    def _one_pass(self, conn: sa.Connection, dag_id: str, mine: dict[str, list[float]]) -> int:
        """The reads of one scheduler pass, each timed into ``mine``; the queue rows it read."""
        began = time.perf_counter()
        queued = fetch(conn, PASS["adrq"])
        mine["adrq"].append((time.perf_counter() - began) * 1000)
        # The DAGs with queue rows are those the scheduler asks for by id (never empty: IN () is invalid).
        triggered = sorted({str(row[1]) for row in queued}) or [dag_id]
        began = time.perf_counter()
        fetch(conn, PASS["dags"], dag_ids=triggered)
        mine["dags"].append((time.perf_counter() - began) * 1000)
        since = dt.datetime.now(dt.timezone.utc) - self.window
        began = time.perf_counter()
        fetch(conn, PASS["events"], dag_id=dag_id, since=since)
        mine["events"].append((time.perf_counter() - began) * 1000)
        conn.rollback()  # the pass's transaction ends: the next pass takes new snapshots
        return len(queued)

    def _sample(self) -> None:
        engine = sa.create_engine(self.url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        samples, waits = 0, Counter[tuple[str, str, str]]()
        try:
            with engine.connect() as conn:
                while not self.stopping.is_set():
                    for kind, event_type, event, count in conn.exec_driver_sql(_WAITS):
                        waits[(str(kind), str(event_type), str(event))] += int(count)
                    samples += 1
                    self.stopping.wait(self.sample_s)
        finally:
            engine.dispose()
            with self.lock:
                self.observed.samples += samples
                self.observed.waits.update(waits)
