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
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from airflow_adrq import manager, retry
from airflow_adrq.engine import create_engine
from airflow_adrq.models import (
    AssetDagRunQueue,
    DagScheduleAssetReference,
)
from airflow_adrq_bench import dataset

__all__ = ["SoakRun", "SoakSizes", "run_soak"]


@dataclass(frozen=True)
class SoakSizes:
    """The default: 32 producers x 1,000 transactions, 3 outlets each."""

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
        return {
            **asdict(self),
            "deadlocks": self.deadlocks,
            "rows_exact": self.rows_exact,
            "tx_per_s": self.committed / self.seconds if self.seconds else 0.0,
        }


def _rss_mib() -> float:
    # Current (not peak) resident set size, from /proc (Linux).
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


_SERVER_CONNECTIONS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
    "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()",
}


def run_soak(url: str, sizes: SoakSizes = SoakSizes(), *, log: Callable[[str], None] = print) -> SoakRun:
    """Run the soak on the (scratch) database at ``url``; PostgreSQL or MySQL/MariaDB."""
    backend = sa.make_url(url).get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in _SERVER_CONNECTIONS:
        raise ValueError(f"the soak needs PostgreSQL or MySQL/MariaDB, not {backend}")
    engine = create_engine(url, pool_size=sizes.producers + 2, max_overflow=0)
    assets = dataset.seed_fan(engine, "soak", outlets=sizes.outlets, fanout=sizes.fanout)
    with engine.connect() as conn:
        refs = conn.execute(
            sa.select(DagScheduleAssetReference.asset_id, DagScheduleAssetReference.dag_id)
        ).all()
    consumers: dict[int, frozenset[str]] = {}
    for asset_id, dag_id in refs:
        consumers[asset_id] = consumers.get(asset_id, frozenset()) | {dag_id}
    result = SoakRun(backend=backend, sizes=asdict(sizes))
    factory = sessionmaker(engine)
    lock = threading.Lock()
    emitted: set[tuple[int, str]] = set()
    consumed: set[tuple[int, str]] = set()
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

    def on_retry(counter: collections.Counter[str]) -> Callable[[int, retry.Retryable], None]:
        def record(_n: int, found: retry.Retryable) -> None:
            with lock:
                counter[found.kind.value] += 1

        return record

    def producer(index: int) -> None:
        rng = random.Random(index)
        for _ in range(sizes.transactions):
            order = list(assets)
            rng.shuffle(order)

            def work(session: Session, sink: list[Callable[[], object]], order: Any = order) -> list[int]:
                events = manager.register_asset_changes(
                    session=session,
                    changes=[manager.AssetChange(asset=_Asset(n, u)) for n, u in order],
                    callback_sink=sink,
                )
                time.sleep(sizes.hold_ms / 1000)
                return [e.asset_id for e in events if e is not None]

            try:
                asset_ids = retry.run_in_transaction(factory, work, on_retry=on_retry(producer_retries))
            except Exception as exc:
                with lock:
                    failed[type(exc).__name__] += 1
                continue
            with lock:
                emitted.update((a, d) for a in asset_ids for d in consumers[a])
                done[0] += 1
                progress = done[0]
            if progress in marks:
                sample(progress)

    def consumer() -> None:
        adrq = cast(sa.Table, AssetDagRunQueue.__table__)
        dags = sorted({d for ds in consumers.values() for d in ds})

        def claim(session: Session, _sink: list[Callable[[], object]], dag: str) -> list[tuple[int, str]]:
            select = sa.select(adrq.c.asset_id, adrq.c.target_dag_id).where(adrq.c.target_dag_id == dag)
            rows = [tuple(r) for r in session.execute(select.with_for_update(skip_locked=True))]
            if rows:
                session.execute(
                    sa.delete(adrq).where(
                        adrq.c.target_dag_id == dag, adrq.c.asset_id.in_([a for a, _ in rows])
                    )
                )
            return [(int(a), str(d)) for a, d in rows]

        while not stop.is_set():
            for dag in dags:
                try:
                    rows = retry.run_in_transaction(
                        factory, functools.partial(claim, dag=dag), on_retry=on_retry(consumer_retries)
                    )
                except Exception as exc:
                    with lock:
                        failed[f"consumer {type(exc).__name__}"] += 1
                    continue
                with lock:
                    consumed.update(rows)
                    result.consumed_rows += len(rows)
            stop.wait(0.01)

    sample(0)
    started = time.monotonic()
    threads = [threading.Thread(target=producer, args=(i,)) for i in range(sizes.producers)]
    consumer_thread = threading.Thread(target=consumer)
    consumer_thread.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    consumer_thread.join()
    result.seconds = time.monotonic() - started
    sample(done[0])
    with engine.connect() as conn:
        queued = {
            (int(a), str(d))
            for a, d in conn.execute(sa.select(AssetDagRunQueue.asset_id, AssetDagRunQueue.target_dag_id))
        }
    result.committed = done[0]
    result.failed = dict(failed)
    result.producer_retries = dict(producer_retries)
    result.consumer_retries = dict(consumer_retries)
    result.rows = {
        "unexpected": len(queued - emitted),
        "missing": len(emitted - queued - consumed),
        "consumed_unemitted": len(consumed - emitted),
    }
    engine.dispose()
    log(
        f"{backend}: {result.committed}/{total} committed in {result.seconds:.0f} s, "
        f"{result.deadlocks} deadlocks, retries {result.producer_retries or 'none'} / consumer "
        f"{result.consumer_retries or 'none'}, rows exact: {result.rows_exact}, samples {result.samples}"
    )
    return result


@dataclass(frozen=True)
class _Asset:
    name: str
    uri: str
