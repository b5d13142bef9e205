"""Sustained load: many producers for many transactions, with a scheduler-like consumer.

``airflow-adrq bench --soak``. Each producer thread runs ``transactions``
multi-outlet transactions through :func:`airflow_adrq.run_in_transaction` +
:func:`airflow_adrq.register_asset_changes` (outlets in a fresh random
order each time, a short hold before COMMIT), while a consumer thread does
what Airflow's scheduler does to the queue: per DAG, lock its queue rows
(``FOR UPDATE SKIP LOCKED`` where the backend has it), delete them, commit.

Reported: transactions and tx/s, deadlocks and other retries (producers and
consumer), the exact-rows check (every emitted pair is queued or was
consumed; nothing else), and growth: this process's resident memory and the
pool's checked-out connections and the server's connections to the
database, sampled before, during and after.
"""

from __future__ import annotations

import collections
import functools
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from airflow_adrq import manager, retry
from airflow_adrq.engine import create_engine
from airflow_adrq_bench import dataset, scheduler

T = TypeVar("T")


@dataclass(frozen=True)
class SoakSizes:
    """How big a soak is.

    The default, 32 producers x 1,000 transactions of 3 outlets, keeps many
    more connections busy than the machine has cores for tens of thousands
    of transactions: long enough for a leak of memory or connections to show
    between the samples.
    """

    producers: int = 32
    transactions: int = 1000
    outlets: int = 3
    fanout: int = 16
    hold_ms: float = 2.0
    samples: int = 5


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


def _rss_mib() -> float:
    # Current (not peak) resident set size, from /proc (Linux).
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


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


def run_soak(url: str, sizes: SoakSizes = SoakSizes(), *, log: Callable[[str], None] = print) -> SoakRun:
    """Run the soak on the (scratch) database at ``url``; PostgreSQL or MySQL/MariaDB."""
    backend = dataset.server_backend(url, "the soak")
    engine = create_engine(url, pool_size=sizes.producers + 2, max_overflow=0)
    assets = dataset.seed_fan(engine, "soak", outlets=sizes.outlets, fanout=sizes.fanout)
    with engine.connect() as conn:
        consumers = dataset.consumer_dags(conn, [a.id for a in assets])
    result = SoakRun(backend=backend, sizes=asdict(sizes))
    factory = sessionmaker(engine)
    lock = threading.Lock()
    emitted: set[dataset.Pair] = set()
    consumed: set[dataset.Pair] = set()
    producer_retries: collections.Counter[str] = collections.Counter()
    consumer_retries: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    done = [0]
    stop = threading.Event()
    total = sizes.producers * sizes.transactions
    marks = {max(1, total * k // sizes.samples) for k in range(1, sizes.samples)}

    def sample(progress: int) -> None:
        with engine.connect() as conn:
            server = int(conn.exec_driver_sql(_SERVER_CONNECTIONS[backend]).scalar_one())
        pool = cast(QueuePool, engine.pool)
        result.samples.append((progress, round(_rss_mib(), 1), pool.checkedout(), server))

    def count(counter: collections.Counter[str], _n: int, found: retry.Retryable) -> None:
        with lock:
            counter[found.kind.value] += 1

    def transact(work: Callable[..., T], retries: collections.Counter[str], who: str) -> T | None:
        """``work`` through ``run_in_transaction``, retries counted; None, counted as failed, if it raised."""
        try:
            return retry.run_in_transaction(factory, work, on_retry=functools.partial(count, retries))
        except Exception as exc:
            with lock:
                failed[f"{who}{type(exc).__name__}"] += 1
            return None

    def work(session: Session, sink: list[Callable[[], object]], order: list[Any]) -> list[int]:
        changes = [manager.AssetChange(asset=a) for a in order]
        events = manager.register_asset_changes(session=session, changes=changes, callback_sink=sink)
        time.sleep(sizes.hold_ms / 1000)
        return [e.asset_id for e in events if e is not None]

    def producer(index: int) -> None:
        rng = random.Random(index)
        for _ in range(sizes.transactions):
            order = list(assets)
            rng.shuffle(order)
            asset_ids = transact(functools.partial(work, order=order), producer_retries, "")
            if asset_ids is None:
                continue
            with lock:
                emitted.update((a, d) for a in asset_ids for d in consumers[a])
                done[0] += 1
                progress = done[0]
            if progress in marks:
                sample(progress)

    def consumer() -> None:
        dags = sorted({d for ds in consumers.values() for d in ds})
        while not stop.is_set():
            for dag in dags:
                rows = transact(functools.partial(_claim, dag=dag), consumer_retries, "consumer ")
                if rows is None:
                    continue
                with lock:
                    consumed.update(rows)
                    result.consumed_rows += len(rows)
            stop.wait(0.01)

    sample(0)
    started = time.monotonic()
    consumer_thread = threading.Thread(target=consumer)
    consumer_thread.start()
    with ThreadPoolExecutor(sizes.producers) as pool:
        list(pool.map(producer, range(sizes.producers)))
    stop.set()
    consumer_thread.join()
    result.seconds = time.monotonic() - started
    sample(done[0])
    with engine.connect() as conn:
        result.rows = dataset.check_rows(dataset.queued_pairs(conn), emitted, consumed)
    engine.dispose()
    result.committed, result.failed = done[0], dict(failed)
    result.producer_retries, result.consumer_retries = dict(producer_retries), dict(consumer_retries)
    log(
        f"{backend}: {result.committed}/{total} committed in {result.seconds:.0f} s, "
        f"{result.deadlocks} deadlocks, retries {result.producer_retries or 'none'} / consumer "
        f"{result.consumer_retries or 'none'}, rows exact: {result.rows_exact}, samples {result.samples}"
    )
    return result
