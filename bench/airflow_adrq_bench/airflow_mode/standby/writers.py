"""The primary's other writers during every phase, the same whatever the manager (controller threads).

* the consumer: the queue rows deleted every ``consume_every_s``, as Airflow's scheduler deletes a DAG's
  rows once it made its run (``SchedulerJobRunner._create_dag_runs_asset_triggered``): without it the
  queue would hold one row per consumer for good, and no read would meet the rows a phase wrote;
* optionally, a writer of the consumers' ``dag`` rows: the DAG processor's ``find_orm_dags`` locks a
  file's DAGs ``FOR NO KEY UPDATE`` while it saves them, which the plug-in's ``FOR SHARE NOWAIT``
  meets: each time, the plug-in rolls back to its SAVEPOINT (another subtransaction);
* the background: XIDs taken at a steady rate by transactions that write nothing else, as the rest
  of a deployment's writers (task states, heartbeats, logs) take them: the producers' XIDs then lie
  spread over as many ``pg_subtrans`` pages as on a busy database, not packed into a few.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

#: ``n`` transactions of one XID each, committed one by one inside the block (a DO block takes no
#: bound parameters: ``n`` is an ``int`` of ours, formatted).
_XIDS = "DO $$ BEGIN FOR i IN 1..{n} LOOP PERFORM txid_current(); COMMIT; END LOOP; END $$"
_CONSUME = "DELETE FROM asset_dag_run_queue"
_LOCK_DAGS = sa.text(
    "SELECT dag_id FROM dag WHERE dag_id IN :dag_ids ORDER BY dag_id FOR NO KEY UPDATE"
).bindparams(sa.bindparam("dag_ids", expanding=True))
#: How often the background takes its share of XIDs.
_TICK_S = 0.25


class Writers:
    """The consumer and the background of one database; :meth:`start`, then :meth:`stop`."""

    def __init__(
        self,
        url: str,
        *,
        consume_every_s: float,
        xids_per_s: float,
        dag_ids: Sequence[str] = (),
        dag_lock_hold_s: float = 0.0,
    ) -> None:
        self.engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.consume_every_s, self.xids_per_s = consume_every_s, xids_per_s
        self.dag_ids, self.dag_lock_hold_s = list(dag_ids), dag_lock_hold_s
        self.stopping = threading.Event()
        self.counts: Counter[str] = Counter()
        self.threads = [threading.Thread(target=self._consume, daemon=True)]
        if xids_per_s > 0:
            self.threads.append(threading.Thread(target=self._background, daemon=True))
        if dag_lock_hold_s > 0 and self.dag_ids:
            self.threads.append(threading.Thread(target=self._lock_dags, daemon=True))

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> dict[str, int]:
        """Stop them; what they did: ``deletes``, ``deleted`` rows, ``xids``, ``dag_locks``, ``errors``."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.engine.dispose()
        return dict(self.counts)

    def _consume(self) -> None:
        with self.engine.connect() as conn:
            while not self.stopping.wait(self.consume_every_s):
                try:
                    self.counts["deleted"] += conn.exec_driver_sql(_CONSUME).rowcount
                    self.counts["deletes"] += 1
                except sa.exc.DBAPIError:  # e.g. a deadlock with a producer: the next tick deletes them
                    self.counts["errors"] += 1

    def _background(self) -> None:
        taken, started = 0, time.monotonic()
        with self.engine.connect() as conn:
            while not self.stopping.wait(_TICK_S):
                due = int((time.monotonic() - started) * self.xids_per_s) - taken
                if due > 0:
                    conn.exec_driver_sql(_XIDS.format(n=int(due)))
                    taken += due
        self.counts["xids"] = taken

    def _lock_dags(self) -> None:
        engine = sa.create_engine(self.engine.url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                while not self.stopping.wait(self.dag_lock_hold_s):  # free as long as held
                    try:
                        with conn.begin():
                            conn.execute(_LOCK_DAGS, {"dag_ids": self.dag_ids}).all()
                            time.sleep(self.dag_lock_hold_s)
                        self.counts["dag_locks"] += 1
                    except sa.exc.DBAPIError:
                        self.counts["errors"] += 1
        finally:
            engine.dispose()
