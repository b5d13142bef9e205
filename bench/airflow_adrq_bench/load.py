"""Producers under stress: connection faults (``bench --faults``) and sustained load (``bench --soak``).

Both run ``producers`` threads on a scratch PostgreSQL or MySQL/MariaDB database seeded with
:func:`airflow_adrq_testing.dataset.seed_fan`, each running multi-outlet transactions through
:func:`airflow_adrq.run_in_transaction` (outlets in random order, a short hold before COMMIT),
retries counted by kind; then the rows are checked against what the callers were told.
``--faults``: a killer thread terminates a producer connection at random every ``kill_every_s``;
a completed run id must have exactly one event per outlet, the only errors raised
``CommitOutcomeUnknownError`` (all of that run's events or none) and ``RetriesExhaustedError``.
``--soak``: a consumer thread does what Airflow's scheduler does to the queue; reported: tx/s,
retries, exact rows, and resident memory and connections sampled before, during and after.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar, cast

import psutil
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, QueuePool

from airflow_adrq import manager, retry
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import CommitOutcomeUnknownError, RetriesExhaustedError
from airflow_adrq.models import AssetEvent
from airflow_adrq_bench.options import Checked, count, nonnegative, positive
from airflow_adrq_testing import dataset, scheduler
from airflow_adrq_testing.strategies import BenchTask

T = TypeVar("T")
Log = Callable[[str], None]


def _count(counts: dict[str, int], key: str, lock: threading.Lock) -> None:
    with lock:
        counts[key] = counts.get(key, 0) + 1


def _run_threads(producers: int, producer: Callable[[int], None]) -> float:
    """``producer(index)`` for every index at once, in threads; the seconds they took."""
    started = time.monotonic()
    with ThreadPoolExecutor(producers) as pool:
        list(pool.map(producer, range(producers)))
    return time.monotonic() - started


@dataclass(frozen=True)
class FaultSizes(Checked):
    """How big a fault run is: about a hundred kills in 200 transactions by default, enough to land in
    each part of a transaction (its work, the commit-time write, the COMMIT) many times."""

    producers: int = count(8)
    transactions: int = count(25)
    outlets: int = count(3)
    fanout: int = count(16)
    hold_ms: float = nonnegative(5.0)
    kill_every_s: float = positive(0.15)
    max_attempts: int = count(8)
    #: Spare a producer once killed until its transaction ends: kills then follow the producers'
    #: progress, not the clock, so a slow (loaded) machine cannot chain them into an exhausted budget.
    one_kill_per_transaction: bool = False


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
        acceptable = self.acceptable_errors_only
        return {**asdict(self), "completed_share": share, "acceptable_errors_only": acceptable}


#: The server's id of the connection running it, the ids of the given connections still alive, and
#: how to end one.
_OWN_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
_ALIVE = {
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE pid IN :ids",
    "mysql": "SELECT id FROM information_schema.processlist WHERE id IN :ids",
}
_KILL = {"postgresql": "SELECT pg_terminate_backend({})", "mysql": "KILL CONNECTION {}"}


def run_faults(
    url: str, sizes: FaultSizes = FaultSizes(), *, seed: int | None = None, log: Log = print
) -> FaultRun:
    """Run the fault scenario on the (scratch) database at ``url`` and check what it left."""
    rng, backend = random.Random(seed), dataset.server_backend(url, "the fault run")
    own = create_engine(url)
    assets = dataset.seed_fan(own, "fault", outlets=sizes.outlets, fanout=sizes.fanout)
    # Nothing of ours but the producers stays connected during the run.
    own.dispose()
    result = FaultRun(backend=backend, sizes=asdict(sizes))
    outcomes: dict[str, str] = {}
    lock, stop, killer_rng = threading.Lock(), threading.Event(), random.Random(rng.random())
    # The producers' connections, recorded as they connect: server id -> its engine.
    producer_ids: dict[int, Engine] = {}
    # With ``one_kill_per_transaction``: the engines whose producer was killed in its current transaction.
    spared: set[Engine] = set()

    def kill() -> None:
        """Terminate one producer connection at random, every ``kill_every_s`` (jittered), until stopped."""
        alive = sa.text(_ALIVE[backend]).bindparams(sa.bindparam("ids", expanding=True))
        engine = sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            while not stop.wait(killer_rng.uniform(0.5, 1.5) * sizes.kill_every_s):
                with lock:
                    known = sorted(i for i, e in producer_ids.items() if e not in spared)
                with contextlib.suppress(sa.exc.DBAPIError):  # the victim left in between
                    victims = [int(r[0]) for r in conn.execute(alive, {"ids": known})] if known else []
                    if victims:
                        victim = killer_rng.choice(victims)
                        conn.exec_driver_sql(_KILL[backend].format(victim))
                        result.kills += 1
                        if sizes.one_kill_per_transaction:
                            with lock:
                                spared.add(producer_ids[victim])
        engine.dispose()

    def work(session: Session, sink: list[Callable[[], object]], order: list[Any], ti: BenchTask) -> None:
        for asset in order:
            manager.register_asset_change(asset=asset, task_instance=ti, session=session, callback_sink=sink)
        time.sleep(sizes.hold_ms / 1000)

    def producer(index: int) -> None:
        engine = create_engine(url, pool_size=1, max_overflow=1)

        @sa.event.listens_for(engine, "connect")
        def record(dbapi_connection: Any, _record: Any) -> None:
            """Record the server id of every connection the producer opens: the killer's victims."""
            cursor = dbapi_connection.cursor()
            cursor.execute(_OWN_ID[backend])
            (own_id,) = cursor.fetchone()
            cursor.close()
            with lock:
                producer_ids[int(own_id)] = engine

        factory = sessionmaker(engine)
        local = random.Random(rng.random())
        for t in range(sizes.transactions):
            run_id = f"p{index}-t{t}"  # names the transaction: the check counts its events by it
            tx = functools.partial(work, order=local.sample(assets, len(assets)), ti=BenchTask(run_id=run_id))
            try:
                retry.run_in_transaction(
                    factory,
                    tx,
                    max_attempts=sizes.max_attempts,
                    on_retry=lambda _n, found: _count(result.retries, found.kind.value, lock),
                    max_wait=0.5,
                )
                outcome = "completed"
            except (CommitOutcomeUnknownError, RetriesExhaustedError) as exc:
                outcome = type(exc).__name__
            except Exception as exc:  # reported, never hidden
                first_line = (str(exc).splitlines() or [""])[0]
                outcome = f"{type(exc).__name__}: {first_line[:120]}"
            with lock:
                outcomes[run_id] = outcome
                spared.discard(engine)
        engine.dispose()

    killer = threading.Thread(target=kill, name="adrq-fault-killer", daemon=True)
    killer.start()
    try:
        result.seconds = _run_threads(sizes.producers, producer)
    finally:  # a producer that raised must not leave the killer running
        stop.set()
        killer.join()
    result.transactions = len(outcomes)
    raised = collections.Counter(outcomes.values())
    result.completed, result.raised = raised.pop("completed", 0), dict(raised)
    # Each run id's events against what its caller was told; the queue against the committed events.
    with own.connect() as conn:
        per_run = collections.Counter(conn.scalars(sa.select(AssetEvent.source_run_id)))
        emitted = list(conn.scalars(sa.select(AssetEvent.asset_id).distinct()))
        consumers = dataset.consumer_dags(conn, emitted)
        queued = dataset.queued_pairs(conn)
    own.dispose()
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
    log(
        f"{backend}: {result.completed}/{result.transactions} completed, {result.kills} kills, "
        f"raised {result.raised or 'nothing'}, {result.duplicate_events} duplicate events, "
        f"{result.half_written} half-written, queue rows exact: {result.queue_rows_exact}"
    )
    return result


@dataclass(frozen=True)
class SoakSizes(Checked):
    """How big a soak is: by default many more connections busy than the machine has cores, for tens of
    thousands of transactions, long enough for a leak of memory or connections to show between samples."""

    producers: int = count(32)
    transactions: int = count(1000)
    outlets: int = count(3)
    fanout: int = count(16)
    hold_ms: float = nonnegative(2.0)
    samples: int = count(5)


@dataclass
class SoakRun:
    backend: str
    sizes: dict[str, Any]
    committed: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    producer_retries: dict[str, int] = field(default_factory=dict)
    consumer_retries: dict[str, int] = field(default_factory=dict)
    consumed_rows: int = 0
    seconds: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    #: (transactions done, RSS MiB, pool checked out, server connections)
    samples: list[tuple[int, float, int, int]] = field(default_factory=list)

    @property
    def deadlocks(self) -> int:
        return self.producer_retries.get("deadlock", 0) + self.consumer_retries.get("deadlock", 0)

    @property
    def rows_exact(self) -> bool:
        return bool(self.rows) and all(v == 0 for v in self.rows.values())

    def as_dict(self) -> dict[str, Any]:
        rate = self.committed / self.seconds if self.seconds else 0.0
        return {**asdict(self), "deadlocks": self.deadlocks, "rows_exact": self.rows_exact, "tx_per_s": rate}


_SERVER_CONNECTIONS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()",
}


def _claim(session: Session, _sink: list[Callable[[], object]], dag: str) -> list[dataset.Pair]:
    """What the scheduler does to one DAG's queue rows: lock them (skipping locked ones), delete them."""
    rows = scheduler.queued(session.connection(), dag)
    if rows:
        scheduler.delete(session.connection(), dag, rows)
    return [(a, dag) for a, _ in rows]


def run_soak(url: str, sizes: SoakSizes = SoakSizes(), *, log: Log = print) -> SoakRun:
    """Run the soak on the (scratch) database at ``url``; PostgreSQL or MySQL/MariaDB."""
    result = SoakRun(backend=dataset.server_backend(url, "the soak"), sizes=asdict(sizes))
    engine = create_engine(url, pool_size=sizes.producers + 2, max_overflow=0)
    assets = dataset.seed_fan(engine, "soak", outlets=sizes.outlets, fanout=sizes.fanout)
    with engine.connect() as conn:
        consumers = dataset.consumer_dags(conn, [a.id for a in assets])
    factory = sessionmaker(engine)
    emitted, consumed = set[dataset.Pair](), set[dataset.Pair]()
    lock, stop = threading.Lock(), threading.Event()
    total = sizes.producers * sizes.transactions
    marks = {max(1, total * k // sizes.samples) for k in range(1, sizes.samples)}

    def sample(progress: int) -> None:
        with engine.connect() as conn:
            server = int(conn.exec_driver_sql(_SERVER_CONNECTIONS[result.backend]).scalar_one())
        rss_mib = psutil.Process().memory_info().rss / 2**20  # current, not peak
        pool = cast(QueuePool, engine.pool)
        result.samples.append((progress, round(rss_mib, 1), pool.checkedout(), server))

    def transact(work: Callable[..., T], retries: dict[str, int], who: str) -> T | None:
        """``work`` through ``run_in_transaction``, retries counted; None, counted as failed, if it raised."""
        try:
            return retry.run_in_transaction(
                factory, work, on_retry=lambda _n, found: _count(retries, found.kind.value, lock)
            )
        except Exception as exc:
            _count(result.failed, f"{who}{type(exc).__name__}", lock)
            return None

    def work(session: Session, sink: list[Callable[[], object]], order: Sequence[Any]) -> list[int]:
        changes = [manager.AssetChange(asset=a) for a in order]
        events = manager.register_asset_changes(session=session, changes=changes, callback_sink=sink)
        time.sleep(sizes.hold_ms / 1000)
        return [e.asset_id for e in events if e is not None]

    def producer(index: int) -> None:
        rng = random.Random(index)
        for _ in range(sizes.transactions):
            order = rng.sample(assets, len(assets))
            asset_ids = transact(functools.partial(work, order=order), result.producer_retries, "")
            if asset_ids is None:
                continue
            with lock:
                emitted.update((a, d) for a in asset_ids for d in consumers[a])
                result.committed += 1
                progress = result.committed
            if progress in marks:
                sample(progress)

    def consumer() -> None:
        dags = sorted({d for ds in consumers.values() for d in ds})
        while not stop.is_set():
            for dag in dags:
                rows = transact(functools.partial(_claim, dag=dag), result.consumer_retries, "consumer ")
                if rows:  # None: it failed (counted)
                    with lock:
                        consumed.update(rows)
                        result.consumed_rows += len(rows)
            stop.wait(0.01)

    sample(0)
    consumer_thread = threading.Thread(target=consumer)
    consumer_thread.start()
    try:
        result.seconds = _run_threads(sizes.producers, producer)
    finally:  # a producer that raised must not leave the consumer running (the process would hang)
        stop.set()
        consumer_thread.join()
    sample(result.committed)
    with engine.connect() as conn:
        result.rows = dataset.check_rows(dataset.queued_pairs(conn), emitted, consumed)
    engine.dispose()
    log(
        f"{result.backend}: {result.committed}/{total} committed in {result.seconds:.0f} s, "
        f"{result.deadlocks} deadlocks, retries {result.producer_retries or 'none'} / consumer "
        f"{result.consumer_retries or 'none'}, rows exact: {result.rows_exact}, samples {result.samples}"
    )
    return result
