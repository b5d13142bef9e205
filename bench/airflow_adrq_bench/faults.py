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
import functools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from airflow_adrq import manager, retry
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import CommitOutcomeUnknownError, RetriesExhaustedError
from airflow_adrq.models import AssetEvent
from airflow_adrq_bench import dataset


@dataclass(frozen=True)
class FaultSizes:
    """How big a fault run is.

    The default makes about a hundred kills in 200 transactions, enough to
    land in each part of a transaction (its work, the commit-time write, the
    COMMIT) many times, in well under a minute.
    """

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
    def acceptable_errors_only(self) -> bool:
        return set(self.raised) <= {"CommitOutcomeUnknownError", "RetriesExhaustedError"}

    def as_dict(self) -> dict[str, Any]:
        share = self.completed / self.transactions if self.transactions else 0.0
        return {
            **asdict(self),
            "completed_share": share,
            "acceptable_errors_only": self.acceptable_errors_only,
        }


#: The server's id of the connection running it, and the ids of the given connections still alive.
_OWN_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
_ALIVE = {
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE pid IN :ids",
    "mysql": "SELECT id FROM information_schema.processlist WHERE id IN :ids",
}


class _Killer(threading.Thread):
    """Terminates one producer connection at random, every ``every_s`` (jittered), until stopped."""

    def __init__(self, url: str, backend: str, every_s: float, rng: random.Random) -> None:
        super().__init__(name="adrq-fault-killer", daemon=True)
        self.engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.backend, self.every_s, self.rng = backend, every_s, rng
        self.stop = threading.Event()
        self.lock = threading.Lock()
        #: The producers' connections, recorded as they connect (:meth:`watch`).
        self.producer_ids: set[int] = set()
        self.kills = 0

    def watch(self, engine: Engine) -> Engine:
        """Record the server id of every connection ``engine`` opens: those are the killer's victims."""

        @sa.event.listens_for(engine, "connect")
        def _record(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(_OWN_ID[self.backend])
            (own_id,) = cursor.fetchone()
            cursor.close()
            with self.lock:
                self.producer_ids.add(int(own_id))

        return engine

    def run(self) -> None:
        alive = sa.text(_ALIVE[self.backend]).bindparams(sa.bindparam("ids", expanding=True))
        with self.engine.connect() as conn:
            while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every_s):
                with self.lock:
                    known = sorted(self.producer_ids)
                try:
                    victims = [int(r[0]) for r in conn.execute(alive, {"ids": known})] if known else []
                    if not victims:
                        continue
                    victim = self.rng.choice(victims)
                    if self.backend == "postgresql":
                        conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": victim})
                    else:
                        conn.exec_driver_sql(f"KILL CONNECTION {int(victim)}")
                    self.kills += 1
                except sa.exc.DBAPIError:  # the victim left in between
                    pass
        self.engine.dispose()


def run_faults(
    url: str, sizes: FaultSizes = FaultSizes(), *, seed: int | None = None, log: Callable[[str], None] = print
) -> FaultRun:
    """Run the fault scenario on the (scratch) database at ``url`` and check what it left.

    ``url`` must name a database this run may fill (the benchmark passes a
    scratch database). PostgreSQL and MySQL/MariaDB only.
    """
    backend = dataset.server_backend(url, "the fault run")
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

    def on_retry(_n: int, found: retry.Retryable) -> None:
        with lock:
            retries[found.kind.value] += 1

    def work(session: Session, sink: list[Callable[[], object]], order: list[Any], ti: _TI) -> None:
        for asset in order:
            manager.register_asset_change(asset=asset, task_instance=ti, session=session, callback_sink=sink)
        time.sleep(sizes.hold_ms / 1000)

    def producer(index: int) -> None:
        engine = killer.watch(create_engine(url, pool_size=1, max_overflow=1))
        factory = sessionmaker(engine)
        local = random.Random(rng.random())
        for t in range(sizes.transactions):
            run_id, order = f"p{index}-t{t}", list(assets)
            local.shuffle(order)
            one = functools.partial(work, order=order, ti=_TI(run_id))
            try:
                retry.run_in_transaction(
                    factory, one, max_attempts=sizes.max_attempts, on_retry=on_retry, max_wait=0.5
                )
                outcome = "completed"
            except (CommitOutcomeUnknownError, RetriesExhaustedError) as exc:
                outcome = type(exc).__name__
            except Exception as exc:  # reported, never hidden
                outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            with lock:
                outcomes[run_id] = outcome
        engine.dispose()

    started = time.monotonic()
    killer.start()
    with ThreadPoolExecutor(sizes.producers) as pool:
        list(pool.map(producer, range(sizes.producers)))
    killer.stop.set()
    killer.join()
    result.seconds = time.monotonic() - started
    result.kills, result.retries, result.transactions = killer.kills, dict(retries), len(outcomes)
    result.completed = sum(1 for o in outcomes.values() if o == "completed")
    result.raised = dict(collections.Counter(o for o in outcomes.values() if o != "completed"))
    _check(url, sizes, outcomes, result)
    log(
        f"{backend}: {result.completed}/{result.transactions} completed, {result.kills} kills, "
        f"raised {result.raised or 'nothing'}, {result.duplicate_events} duplicate events, "
        f"{result.half_written} half-written, queue rows exact: {result.queue_rows_exact}"
    )
    return result


def _check(url: str, sizes: FaultSizes, outcomes: dict[str, str], result: FaultRun) -> None:
    """Each run id's events against what its caller was told; the queue against the committed events."""
    engine = create_engine(url)
    with engine.connect() as conn:
        per_run = collections.Counter(
            run_id for (run_id,) in conn.execute(sa.select(AssetEvent.source_run_id))
        )
        emitted = [a for (a,) in conn.execute(sa.select(AssetEvent.asset_id).distinct())]
        consumers = dataset.consumer_dags(conn, emitted)
        queued = dataset.queued_pairs(conn)
    engine.dispose()
    for run_id, outcome in outcomes.items():
        count = per_run.get(run_id, 0)
        if count > sizes.outlets:
            result.duplicate_events += 1
        elif 0 < count < sizes.outlets or (outcome == "completed" and count != sizes.outlets):
            result.half_written += 1
        if outcome == "CommitOutcomeUnknownError":
            result.unknown_committed += count == sizes.outlets
            result.unknown_not_committed += count == 0
    result.queue_rows_exact = queued == {(a, d) for a, dags in consumers.items() for d in dags}


@dataclass(frozen=True)
class _TI:
    """The producing task: its ``run_id`` names the transaction, so the check can count its events."""

    run_id: str
    dag_id: str = "fault_producer"
    task_id: str = "emit"
    map_index: int = -1
