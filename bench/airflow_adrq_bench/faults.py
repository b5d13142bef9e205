"""Producers under connection faults: a killer terminates their connections at random.

``airflow-adrq bench --faults`` (and ``tests/concurrency/test_fault_run.py``,
bounded to seconds). Every producer transaction goes through
:func:`airflow_adrq.run_in_transaction` + :func:`airflow_adrq.register_asset_change`,
one event per outlet, tagged with a unique ``source_run_id``. Meanwhile a
killer thread terminates one producer connection at random every
``kill_every_s`` (PostgreSQL ``pg_terminate_backend``, MySQL/MariaDB
``KILL CONNECTION``), whatever the producer is doing at that moment: its
work, the commit-time queue write, or the COMMIT itself.

Afterwards the database is checked against what the callers were told:

* completed: ``run_in_transaction`` returned; its run id must have exactly
  one event per outlet;
* raised: the exception type (only ``CommitOutcomeUnknownError`` and
  ``RetriesExhaustedError`` are acceptable); a run whose COMMIT outcome was
  unknown must have all of its events or none;
* duplicate events: a run id with more events than outlets;
* half-written: a run id with some but not all of its events, or a
  committed event whose consumers are not all queued.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from airflow_adrq import manager, retry
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import CommitOutcomeUnknownError, RetriesExhaustedError
from airflow_adrq.models import (
    AssetDagRunQueue,
    AssetEvent,
    DagScheduleAssetReference,
)
from airflow_adrq_bench import dataset

__all__ = ["FaultRun", "FaultSizes", "run_faults"]


@dataclass(frozen=True)
class FaultSizes:
    """How big a fault run is (default: 8 producers, 3 outlets, a kill every ~150 ms)."""

    producers: int = 8
    transactions: int = 25
    outlets: int = 3
    fanout: int = 16
    hold_ms: float = 5.0
    kill_every_s: float = 0.15
    max_attempts: int = 8


@dataclass
class FaultRun:
    """What happened, and what the database says about it."""

    backend: str
    sizes: dict[str, Any]
    transactions: int = 0
    completed: int = 0
    raised: dict[str, int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    duplicate_events: int = 0
    half_written: int = 0
    unknown_committed: int = 0
    unknown_not_committed: int = 0
    queue_rows_exact: bool = False
    seconds: float = 0.0

    @property
    def completed_share(self) -> float:
        return self.completed / self.transactions if self.transactions else 0.0

    @property
    def acceptable_errors_only(self) -> bool:
        return set(self.raised) <= {"CommitOutcomeUnknownError", "RetriesExhaustedError"}

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "completed_share": self.completed_share,
            "acceptable_errors_only": self.acceptable_errors_only,
        }


class _Killer(threading.Thread):
    """Terminates one producer connection at random, every ``every_s`` (jittered), until stopped."""

    def __init__(self, url: str, backend: str, every_s: float, rng: random.Random) -> None:
        super().__init__(name="adrq-fault-killer", daemon=True)
        self.engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.backend = backend
        self.every_s = every_s
        self.rng = rng
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.producer_ids: set[int] = set()
        self.kills = 0
        self.errors: list[str] = []

    def _victims(self, conn: sa.Connection) -> list[int]:
        # Producer connections only (recorded as they connect), still alive.
        with self.lock:
            known = sorted(self.producer_ids)
        if not known:
            return []
        alive = sa.text(
            "SELECT pid FROM pg_stat_activity WHERE pid IN :ids"
            if self.backend == "postgresql"
            else "SELECT id FROM information_schema.processlist WHERE id IN :ids"
        ).bindparams(sa.bindparam("ids", expanding=True))
        return [int(r[0]) for r in conn.execute(alive, {"ids": known})]

    def _kill(self, conn: sa.Connection, victim: int) -> None:
        if self.backend == "postgresql":
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": victim})
        else:
            conn.exec_driver_sql(f"KILL CONNECTION {int(victim)}")

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every_s):
                try:
                    victims = self._victims(conn)
                    if victims:
                        self._kill(conn, self.rng.choice(victims))
                        self.kills += 1
                except sa.exc.DBAPIError as exc:  # the victim left in between
                    self.errors.append(str(exc.orig).splitlines()[0])
        self.engine.dispose()


_OWN_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


def _producer_engine(url: str, backend: str, killer: _Killer) -> Engine:
    engine = create_engine(url, pool_size=1, max_overflow=1)

    @sa.event.listens_for(engine, "connect")
    def _record(dbapi_connection: Any, _record: Any) -> None:
        # Tell the killer which server connections are producers'.
        cursor = dbapi_connection.cursor()
        cursor.execute(_OWN_ID[backend])
        (own_id,) = cursor.fetchone()
        cursor.close()
        with killer.lock:
            killer.producer_ids.add(int(own_id))

    return engine


def run_faults(
    url: str, sizes: FaultSizes = FaultSizes(), *, seed: int | None = None, log: Callable[[str], None] = print
) -> FaultRun:
    """Run the fault scenario on the (scratch) database at ``url`` and check what it left.

    ``url`` must name a database this run may fill (the benchmark passes a
    scratch database). PostgreSQL and MySQL/MariaDB only.
    """
    backend = sa.make_url(url).get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in ("postgresql", "mysql"):
        raise ValueError(f"the fault run needs PostgreSQL or MySQL/MariaDB, not {backend}")
    rng = random.Random(seed)
    seed_engine = create_engine(url)
    assets = dataset.seed_fan(seed_engine, "fault", outlets=sizes.outlets, fanout=sizes.fanout)
    # Nothing of ours but the producers stays connected during the run.
    seed_engine.dispose()
    result = FaultRun(backend=backend, sizes=asdict(sizes))
    outcomes: dict[str, str] = {}
    retries: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    killer = _Killer(url, backend, sizes.kill_every_s, random.Random(rng.random()))

    def producer(index: int) -> None:
        engine = _producer_engine(url, backend, killer)
        factory = sessionmaker(engine)
        local = random.Random(rng.random())
        try:
            for t in range(sizes.transactions):
                run_id = f"p{index}-t{t}"
                order = list(assets)
                local.shuffle(order)

                def work(
                    session: Session,
                    sink: list[Callable[[], object]],
                    order: Any = order,
                    run_id: str = run_id,
                ) -> None:
                    for name, uri in order:
                        manager.register_asset_change(
                            asset=_Asset(name, uri),
                            task_instance=_TI(run_id),
                            session=session,
                            callback_sink=sink,
                        )
                    time.sleep(sizes.hold_ms / 1000)

                def on_retry(_n: int, found: retry.Retryable) -> None:
                    with lock:
                        retries[found.kind.value] += 1

                try:
                    retry.run_in_transaction(
                        factory, work, max_attempts=sizes.max_attempts, on_retry=on_retry, max_wait=0.5
                    )
                    outcome = "completed"
                except (CommitOutcomeUnknownError, RetriesExhaustedError) as exc:
                    outcome = type(exc).__name__
                except Exception as exc:  # reported, never hidden
                    outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                with lock:
                    outcomes[run_id] = outcome
        finally:
            engine.dispose()

    started = time.monotonic()
    killer.start()
    threads = [threading.Thread(target=producer, args=(i,)) for i in range(sizes.producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    killer.stop.set()
    killer.join()
    result.seconds = time.monotonic() - started
    result.kills = killer.kills
    result.retries = dict(retries)
    result.transactions = len(outcomes)
    result.completed = sum(1 for o in outcomes.values() if o == "completed")
    result.raised = dict(collections.Counter(o for o in outcomes.values() if o != "completed"))
    check_engine = create_engine(url)
    try:
        _check(check_engine, sizes, outcomes, result)
    finally:
        check_engine.dispose()
    log(
        f"{backend}: {result.completed}/{result.transactions} completed, {result.kills} kills, "
        f"raised {result.raised or 'nothing'}, {result.duplicate_events} duplicate events, "
        f"{result.half_written} half-written, queue rows exact: {result.queue_rows_exact}"
    )
    return result


def _check(engine: Engine, sizes: FaultSizes, outcomes: dict[str, str], result: FaultRun) -> None:
    with engine.connect() as conn:
        per_run = collections.Counter(
            run_id for (run_id,) in conn.execute(sa.select(AssetEvent.source_run_id))
        )
        queued = {
            tuple(r)
            for r in conn.execute(sa.select(AssetDagRunQueue.asset_id, AssetDagRunQueue.target_dag_id))
        }
        consumers = {
            tuple(r)
            for r in conn.execute(
                sa.select(DagScheduleAssetReference.asset_id, DagScheduleAssetReference.dag_id)
            )
        }
        emitted_assets = {a for (a,) in conn.execute(sa.select(AssetEvent.asset_id).distinct())}
    for run_id, outcome in outcomes.items():
        count = per_run.get(run_id, 0)
        if count > sizes.outlets:
            result.duplicate_events += 1
        elif 0 < count < sizes.outlets or (outcome == "completed" and count != sizes.outlets):
            result.half_written += 1
        if outcome == "CommitOutcomeUnknownError":
            if count == sizes.outlets:
                result.unknown_committed += 1
            elif count == 0:
                result.unknown_not_committed += 1
    expected = {(a, d) for (a, d) in consumers if a in emitted_assets}
    result.queue_rows_exact = queued == expected


@dataclass(frozen=True)
class _Asset:
    name: str
    uri: str


@dataclass(frozen=True)
class _TI:
    run_id: str
    dag_id: str = "fault_producer"
    task_id: str = "emit"
    map_index: int = -1
