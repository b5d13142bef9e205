"""Concurrent producer transactions in threads, with the benchmark's building blocks.

Producers run in waves: all threads start a transaction together (a
barrier), each runs one whole producer transaction through
the test support's :func:`~airflow_adrq_testing.transactions.run_transaction` (insert the event(s), queue,
hold the transaction open, COMMIT; on a deadlock retry the whole transaction
and count it), and when all are done the queue is checked for exactly the
rows the committed transactions emitted, then emptied.

Why waves on an emptied queue: on PostgreSQL ``ON CONFLICT DO NOTHING`` takes no
lock on a row that is already committed, so concurrent producers can only
deadlock while they insert rows that do not exist yet. In Airflow the
scheduler keeps deleting queue rows, so fresh inserts are the normal case.

Each thread has its own connection (the pool is as large as the thread
count). Threads are enough: every wait happens in the database, outside the
GIL. ``airflow-adrq bench`` runs the same transactions in separate processes.

A strategy's transaction is its whole ``register_asset_change`` path per
emitted asset (see :mod:`airflow_adrq_testing.strategies`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq.models import AssetDagRunQueue
from airflow_adrq_testing import dataset, strategies
from airflow_adrq_testing.transactions import emitted_assets, process_rng, run_transaction

Work = Callable[[Session], None]
EXACT = {"unexpected": 0, "missing": 0, "consumed_unemitted": 0}


@dataclass
class Outcome:
    results: list = field(default_factory=list)
    #: One exact-rows check per wave.
    checks: list = field(default_factory=list)

    @property
    def deadlocks(self) -> int:
        return sum(r.failures.get("deadlock", 0) for r in self.results)

    @property
    def committed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failure_counts(self) -> dict:
        counts: dict = {}
        for r in self.results:
            for kind, n in r.failures.items():
                counts[kind] = counts.get(kind, 0) + n
        return counts

    @property
    def rows_exact(self) -> bool:
        return bool(self.checks) and all(c == EXACT for c in self.checks)


def seeded_engine(db_url: str, *, fanout: int, outlets: int, threads: int):
    """A pooled engine with bounded lock waits, on a database seeded like the benchmark's."""
    eng = dataset.bench_engine(db_url, lock_timeout_s=5, pool_size=threads)
    dataset.seed(eng, fanout=fanout, outlets=outlets, paused=1, parties=threads, sweeps=(1,))
    return eng


class Producer:
    """Per transaction: emit the scenario's assets (fresh random order) with ``strategy``."""

    def __init__(self, strategy: str, scenario: str, assets: list[dataset.SeedAsset]):
        self.emit = strategies.get(strategy)
        self.scenario = scenario
        self.assets = assets

    def __call__(self, rng) -> tuple[list[int], Work]:
        assets = emitted_assets(self.scenario, self.assets, rng)
        return [a.id for a in assets], lambda session: self.emit(session, assets, rng)


def run_waves(
    eng,
    producers: list[Callable],
    *,
    waves: int,
    expected: Callable[[list], set],
    hold_ms: float = 5.0,
    timeout_s: float = 20.0,
    stop_on_deadlock: bool = False,
) -> Outcome:
    """Run ``waves`` waves; in each, thread i runs one transaction from ``producers[i](rng)``.

    ``producers[i](rng)`` returns ``(assets, work)``; ``expected(results)``
    gives the (asset, dag) pairs a wave's committed results must have queued.
    With ``stop_on_deadlock`` a transaction is not retried and the run ends
    after the first wave that saw a deadlock (PostgreSQL takes
    ``deadlock_timeout``, 1 s by default, to detect each one).
    """
    outcome = Outcome()
    wave_results: list = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list = []
    deadline = time.monotonic() + timeout_s
    adrq = AssetDagRunQueue.__table__

    def end_of_wave():
        # Runs in one thread once every thread has finished its transaction.
        with eng.connect() as conn:
            queued = dataset.queued_pairs(conn)
        outcome.checks.append(dataset.check_rows(queued, expected(wave_results), set()))
        outcome.results.extend(wave_results)
        if stop_on_deadlock and any(r.failures.get("deadlock") for r in wave_results):
            stop.set()
        if time.monotonic() > deadline:
            stop.set()
        wave_results.clear()
        with eng.begin() as conn:
            conn.execute(sa.delete(adrq))

    start = threading.Barrier(len(producers), timeout=timeout_s + 30)
    end = threading.Barrier(len(producers), action=end_of_wave, timeout=timeout_s + 30)

    def body(producer):
        rng = process_rng()
        try:
            for _ in range(waves):
                start.wait()
                if stop.is_set():
                    return
                assets, work = producer(rng)
                result = run_transaction(
                    eng,
                    work,
                    max_attempts=20,
                    deadline=deadline,
                    hold_s=hold_ms / 1000,
                    assets=assets,
                    # When only the first deadlock matters, do not retry into more.
                    give_up=lambda: stop_on_deadlock,
                )
                with lock:
                    wave_results.append(result)
                end.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
            start.abort()
            end.abort()

    threads = [threading.Thread(target=body, args=(p,)) for p in producers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 60)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a producer thread did not finish"
    return outcome


def run_producers(
    db_url,
    strategy,
    scenario,
    *,
    producers=6,
    waves=6,
    fanout=24,
    outlets=3,
    hold_ms=5.0,
    timeout_s=20.0,
    stop_on_deadlock=False,
) -> Outcome:
    """Concurrent producers with one strategy (benchmark seed data and transactions)."""
    eng = seeded_engine(db_url, fanout=fanout, outlets=outlets, threads=producers)
    try:
        with eng.connect() as conn:
            assets = dataset.main_assets(conn)
            consumers = dataset.consumer_dags(conn, [a.id for a in assets])

        def expected(results):
            return {(a, d) for r in results if r.ok for a in r.assets for d in consumers[a]}

        return run_waves(
            eng,
            [Producer(strategy, scenario, assets) for _ in range(producers)],
            waves=waves,
            expected=expected,
            hold_ms=hold_ms,
            timeout_s=timeout_s,
            stop_on_deadlock=stop_on_deadlock,
        )
    finally:
        eng.dispose()
