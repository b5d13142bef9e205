"""Producer, consumer and coordinator loops, and the fan-out sweep.

One process per party (the pytest-xdist suite gives each its own worker):

* party 0, the coordinator: empties the queue before every round, acts as
  the scheduler in ``with_consumer`` rounds, and checks the rows after the
  round;
* parties 1..N, the producers: run ``transactions`` producer transactions
  per round, each retried as a whole on a deadlock, lock timeout,
  serialization failure or SQLite busy error, and append one JSON line per
  transaction to ``tx-<party>.jsonl``.

A producer transaction is what task success does to the queue: per emitted
asset insert the ``asset_event`` row and queue its consumers (with the
strategy under test), then stay open ``hold_ms`` (the rest of the
task-success transaction), then COMMIT.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from airflow_adrq.bench import barrier, counting, dataset, strategies
from airflow_adrq.bench.config import Cell, Plan, Sizes
from airflow_adrq.models import AssetDagRunQueue, AssetEvent, utcnow
from airflow_adrq.retry import classify

__all__ = [
    "TxResult",
    "process_rng",
    "run_coordinator",
    "run_producer",
    "run_sweep",
    "run_transaction",
]

_ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)
_EVENT = cast(sa.Table, AssetEvent.__table__)


def process_rng() -> random.Random:
    """A generator seeded from ``os.urandom``: every process gets its own order.

    This is what models the order a Python ``set`` of freshly loaded
    ``DagModel`` objects iterates in (see :mod:`airflow_adrq.baselines`);
    it does not depend on ``PYTHONHASHSEED``, which pytest-xdist and plugins
    may pin.
    """
    return random.Random(int.from_bytes(os.urandom(8), "big"))


# --- one producer transaction ---------------------------------------------------


@dataclass
class TxResult:
    """One producer transaction, over all its attempts."""

    ok: bool
    attempts: int
    latency_s: float
    #: Statements sent by the attempt that committed (0 if none did).
    statements: int
    assets: list[int]
    failures: dict[str, int] = field(default_factory=dict)


def run_transaction(
    engine: Engine,
    work: Callable[[Session], None],
    *,
    max_attempts: int,
    deadline: float,
    hold_s: float,
    rng: random.Random,
    assets: Sequence[int] = (),
    give_up: Callable[[], bool] = lambda: False,
) -> TxResult:
    """Run ``work`` + hold + COMMIT, retrying the whole transaction on retryable failures.

    Gives up after ``max_attempts`` attempts, once ``time.monotonic()``
    passes ``deadline``, or when ``give_up()`` says so. Other errors propagate.
    """
    failures: Counter[str] = Counter()
    start = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        counting.reset()
        try:
            with Session(engine) as session:
                work(session)
                if hold_s:
                    time.sleep(hold_s)
                session.commit()
        except Exception as exc:
            retryable = classify(exc)
            if retryable is None:
                raise
            failures[retryable.kind.value] += 1
            if attempt >= max_attempts or time.monotonic() > deadline or give_up():
                return TxResult(False, attempt, time.perf_counter() - start, 0, list(assets), dict(failures))
            # Jittered backoff, so two victims do not restart in lockstep.
            time.sleep(rng.uniform(0, min(0.05, 0.005 * attempt)))
            continue
        elapsed = time.perf_counter() - start
        return TxResult(True, attempt, elapsed, counting.value(), list(assets), dict(failures))


def producer_work(
    queue_one: strategies.QueueOne, assets: Sequence[int], rng: random.Random
) -> Callable[[Session], None]:
    """Per asset: insert its event, then queue its consumers."""

    def work(session: Session) -> None:
        for asset_id in assets:
            session.execute(
                sa.insert(_EVENT).values(
                    asset_id=asset_id, extra={}, timestamp=utcnow(), source_dag_id="bench"
                )
            )
            queue_one(session, asset_id, rng)

    return work


def emitted_assets(scenario: str, asset_ids: Sequence[int], rng: random.Random) -> list[int]:
    """The assets one transaction emits: one, or all outlets in random order."""
    if scenario == "single":
        return [asset_ids[0]]
    emitted = list(asset_ids)
    rng.shuffle(emitted)
    return emitted


# --- the parties ---------------------------------------------------------------


class _Engines:
    """One engine per database URL, disposed when the run moves to another."""

    def __init__(self, sizes: Sizes) -> None:
        self._sizes = sizes
        self._url: str | None = None
        self._engine: Engine | None = None

    def get(self, url: str) -> Engine:
        if url != self._url:
            self.close()
            self._engine = dataset.bench_engine(url, lock_timeout_s=self._sizes.lock_timeout_s)
            self._url = url
        assert self._engine is not None
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        self._engine, self._url = None, None


def run_producer(plan: Plan, party: int) -> None:
    """Party ``party`` (1..N): every round, run the producer transactions."""
    sizes = plan.sizes
    out = Path(plan.out_dir)
    sync = out / "barriers"
    rng = process_rng()
    engines = _Engines(sizes)
    try:
        with (out / f"tx-{party}.jsonl").open("a") as sink:
            for cell in plan.cells:
                engine = engines.get(cell.url)
                with engine.connect() as conn:
                    asset_ids = dataset.main_asset_ids(conn)
                queue_one = strategies.get(cell.strategy)
                barrier.wait(
                    sync, f"start-{cell.index}", party, plan.parties, timeout_s=plan.barrier_timeout_s
                )
                deadline = time.monotonic() + sizes.round_timeout_s
                for _ in range(sizes.transactions):
                    if time.monotonic() > deadline:
                        break
                    assets = emitted_assets(cell.scenario, asset_ids, rng)
                    result = run_transaction(
                        engine,
                        producer_work(queue_one, assets, rng),
                        max_attempts=sizes.max_attempts,
                        deadline=deadline,
                        hold_s=sizes.hold_ms / 1000,
                        rng=rng,
                        assets=assets,
                    )
                    sink.write(json.dumps({"cell": cell.index, "party": party, **asdict(result)}) + "\n")
                    sink.flush()
                barrier.arrive(sync, f"done-{cell.index}", party)
                barrier.wait(sync, f"end-{cell.index}", party, plan.parties, timeout_s=plan.barrier_timeout_s)
    finally:
        engines.close()


def run_coordinator(plan: Plan) -> None:
    """Party 0: reset before each round, consume in ``with_consumer``, check rows after."""
    sizes = plan.sizes
    out = Path(plan.out_dir)
    sync = out / "barriers"
    rng = process_rng()
    engines = _Engines(sizes)
    try:
        with (out / "cells.jsonl").open("a") as sink:
            for cell in plan.cells:
                engine = engines.get(cell.url)
                dataset.reset(engine)
                with engine.connect() as conn:
                    asset_ids = dataset.main_asset_ids(conn)
                    consumers = dataset.consumer_dags(conn, asset_ids)
                (out / "current").write_text(json.dumps(asdict(cell)))
                barrier.wait(sync, f"start-{cell.index}", 0, plan.parties, timeout_s=plan.barrier_timeout_s)
                started = time.perf_counter()
                consumer: dict[str, Any] = {}
                consumed: set[dataset.Pair] = set()
                if cell.scenario == "with_consumer":
                    dags = sorted(set().union(*consumers.values()))
                    consumer, consumed = _consume(engine, sync, cell, sizes, dags, rng)
                while barrier.arrived(sync, f"done-{cell.index}") < sizes.producers:
                    if time.perf_counter() - started > plan.barrier_timeout_s:
                        raise barrier.BarrierTimeoutError(f"producers did not finish {cell.label}")
                    time.sleep(0.001)
                duration = time.perf_counter() - started
                barrier.wait(sync, f"end-{cell.index}", 0, plan.parties, timeout_s=plan.barrier_timeout_s)
                emitted = _emitted_pairs(out, cell, sizes.producers, consumers)
                with engine.connect() as conn:
                    queued = dataset.queued_pairs(conn)
                check = dataset.check_rows(queued, emitted, consumed)
                record = {
                    **asdict(cell),
                    "duration_s": duration,
                    "queued_rows": len(queued),
                    "emitted_pairs": len(emitted),
                    "consumed_pairs": len(consumed),
                    "check": check,
                    "exact": not any(check.values()),
                    "consumer": consumer,
                }
                sink.write(json.dumps(record) + "\n")
                sink.flush()
    finally:
        engines.close()


def _emitted_pairs(
    out: Path, cell: Cell, producers: int, consumers: dict[int, frozenset[str]]
) -> set[dataset.Pair]:
    emitted: set[dataset.Pair] = set()
    for party in range(1, producers + 1):
        path = out / f"tx-{party}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            tx = json.loads(line)
            if tx["cell"] == cell.index and tx["ok"]:
                for asset_id in tx["assets"]:
                    emitted.update((asset_id, d) for d in consumers[asset_id])
    return emitted


def _consume(
    engine: Engine, sync: Path, cell: Cell, sizes: Sizes, dags: Sequence[str], rng: random.Random
) -> tuple[dict[str, Any], set[dataset.Pair]]:
    """Behave like the scheduler until every producer is done.

    Per transaction: claim one DAG's queue rows ``FOR UPDATE SKIP LOCKED``
    (as Airflow 3.3's ``_create_dag_runs_asset_triggered``; SQLite has no row
    locks and ignores the clause, BEGIN IMMEDIATE serialises instead), record
    a run, delete exactly the claimed rows, commit.
    """
    consumed: set[dataset.Pair] = set()
    claims = 0
    failures: Counter[str] = Counter()
    order = list(dags)
    rng.shuffle(order)
    deadline = time.monotonic() + sizes.round_timeout_s + 2 * sizes.lock_timeout_s
    i = 0
    while barrier.arrived(sync, f"done-{cell.index}") < sizes.producers and time.monotonic() < deadline:
        dag = order[i % len(order)]
        i += 1
        claimed: list[dataset.Pair] = []

        def claim(session: Session, dag: str = dag, claimed: list[dataset.Pair] = claimed) -> None:
            claimed.clear()
            rows = session.execute(
                sa.select(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id)
                .where(_ADRQ.c.target_dag_id == dag)
                .order_by(_ADRQ.c.created_at.desc())
                .with_for_update(skip_locked=True)
            ).all()
            if not rows:
                return
            claimed.extend((int(a), str(d)) for a, d in rows)
            session.execute(sa.insert(dataset.bench_run).values(dag_id=dag, queued_rows=len(rows)))
            session.execute(
                sa.delete(_ADRQ).where(sa.tuple_(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id).in_(claimed))
            )

        result = run_transaction(
            engine, claim, max_attempts=sizes.max_attempts, deadline=deadline, hold_s=0, rng=rng
        )
        failures.update(result.failures)
        if result.ok and claimed:
            claims += 1
            consumed.update(claimed)
        time.sleep(0.002)
    return {"claims": claims, "failures": dict(failures)}, consumed


# --- fan-out sweep --------------------------------------------------------------


def run_sweep(
    url: str,
    sizes: Sizes,
    strategy_names: Iterable[str],
    *,
    budget_s: float = 20.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Single-caller latency of one queue call + COMMIT on an empty queue, per fan-out.

    Skips a (strategy, fan-out) whose projected time (from the previous
    fan-out, linearly) exceeds ``budget_s``; the row says so.
    """
    engine = dataset.bench_engine(url, lock_timeout_s=sizes.lock_timeout_s)
    rng = process_rng()
    results: list[dict[str, Any]] = []
    try:
        with engine.connect() as conn:
            asset_of = {f: dataset.sweep_asset_id(conn, f) for f in sizes.sweep}
        for name in strategy_names:
            queue_one = strategies.get(name)
            # One untimed call first: statement compilation and ORM setup are
            # one-off costs, not per-call ones.
            with Session(engine) as session:
                queue_one(session, asset_of[min(sizes.sweep)], rng)
                session.rollback()
            previous: tuple[int, float] | None = None
            for fanout in sorted(sizes.sweep):
                row: dict[str, Any] = {"strategy": name, "fanout": fanout}
                projected = previous[1] * fanout / previous[0] * sizes.sweep_repeats if previous else 0.0
                if projected > budget_s:
                    row["skipped"] = f"projected over {budget_s:.0f} s"
                    results.append(row)
                    continue
                if progress:
                    progress(f"sweep {name} fan-out {fanout}")
                latencies, statements, rows_ok = [], 0, True
                for _ in range(sizes.sweep_repeats):
                    dataset.reset(engine)
                    counting.reset()
                    start = time.perf_counter()
                    with Session(engine) as session:
                        queue_one(session, asset_of[fanout], rng)
                        session.commit()
                    latencies.append(time.perf_counter() - start)
                    statements = counting.value()
                    with engine.connect() as conn:
                        rows_ok = rows_ok and len(dataset.queued_pairs(conn)) == fanout
                median = statistics.median(latencies)
                row.update(latency_s=median, statements=statements, rows_exact=rows_ok)
                previous = (fanout, median)
                results.append(row)
    finally:
        dataset.reset(engine)
        engine.dispose()
    return results
