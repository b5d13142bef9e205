"""The parties' loops of the concurrent rounds, the fan-out sweep and the raw-SQL ratio.

Party 0, the coordinator, empties the queue before every round, is the scheduler of ``with_consumer`` and
``lost_events`` rounds and checks the rows after; parties 1..N, the producers, run the round's transactions
(what task success does: the strategy's ``register_asset_change`` per emitted asset, ``hold_ms`` open,
COMMIT; retried as a whole) and append a JSON line per transaction to ``tx-<party>.jsonl``. A round: one
untimed warm-up transaction per producer on its own assets; barriers ``warm``, ``start``, ``done``, ``end``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq import dialects
from airflow_adrq.models import utcnow
from airflow_adrq_bench import barrier, rawsql
from airflow_adrq_bench.config import Cell, Plan, Sizes
from airflow_adrq_bench.stats import latency, median
from airflow_adrq_testing import dataset, scheduler, strategies
from airflow_adrq_testing.recording import counting
from airflow_adrq_testing.transactions import (
    NOT_STARTED,
    TxResult,
    emitted_assets,
    process_rng,
    run_transaction,
)


def round_records(
    count: int,
    deadline: float,
    run_one: Callable[[], TxResult],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[dict[str, Any]]:
    """Exactly ``count`` records: ``run_one()`` while before ``deadline`` (committed or gave up), then
    ``not started``, so that committed + gave up + not started always adds up to the plan."""
    for done in range(count):
        if clock() > deadline:
            for _ in range(count - done):
                yield {**asdict(TxResult(False, 0, 0.0, 0, [])), "outcome": NOT_STARTED}
            return
        result = run_one()
        yield {**asdict(result), "outcome": result.outcome}


def share(total: int, producers: int, party: int) -> int:
    """Party ``party``'s part of ``total`` transactions split over ``producers`` (1-based)."""
    return total // producers + (1 if party <= total % producers else 0)


@contextlib.contextmanager
def _engines(plan: Plan) -> Iterator[dict[str, Engine]]:
    """An engine per database of the plan, kept for the run (it connects once its rounds begin)."""
    urls = dict.fromkeys(cell.url for cell in plan.cells)
    engines = {url: dataset.bench_engine(url, lock_timeout_s=plan.sizes.lock_timeout_s) for url in urls}
    try:
        yield engines
    finally:
        for engine in engines.values():
            engine.dispose()


def _wait(plan: Plan, name: str, cell: Cell, party: int, **poll: Any) -> None:
    """Barrier ``<name>-<round>`` (:func:`.barrier.wait`); its error names the round."""
    sync, timeout = Path(plan.out_dir) / "barriers", plan.barrier_timeout_s
    try:
        barrier.wait(sync, f"{name}-{cell.index}", party, plan.parties, timeout_s=timeout, **poll)
    except barrier.BarrierTimeoutError as exc:
        raise barrier.BarrierTimeoutError(f"{cell.label}: {exc}") from None


def _transaction(
    engine: Engine, cell: Cell, assets: Sequence[dataset.SeedAsset], rng: random.Random, **kw: Any
) -> TxResult:
    """One producer transaction of ``cell``'s strategy over the assets its scenario emits."""
    emitted = emitted_assets(cell.scenario, assets, rng)
    emit = strategies.get(cell.strategy)
    return run_transaction(
        engine, lambda session: emit(session, emitted, rng), assets=[a.id for a in emitted], **kw
    )


def run_producer(plan: Plan, party: int) -> None:
    """Party ``party`` (1..N): every round it takes part in, warm up, then run its transactions."""
    sizes, rng = plan.sizes, process_rng()
    with _engines(plan) as engines, (Path(plan.out_dir) / f"tx-{party}.jsonl").open("a") as sink:
        for cell in plan.cells:
            engine, active, lost = engines[cell.url], party <= cell.producers, cell.scenario == "lost_events"
            tx = functools.partial(_transaction, engine, cell, rng=rng, max_attempts=sizes.max_attempts)
            if active:
                with engine.connect() as conn:
                    if lost:
                        assets = [dataset.asset(conn, "lost_asset")]
                        warm = [dataset.asset(conn, f"lost_warm_{party}")]
                    else:
                        assets, warm = dataset.main_assets(conn), dataset.warm_assets(conn, party)
                tx(warm, deadline=time.monotonic() + plan.barrier_timeout_s, hold_s=0)
            _wait(plan, "warm", cell, party)
            _wait(plan, "start", cell, party)
            if active:
                count = share(sizes.lost_events, cell.producers, party) if lost else cell.transactions(sizes)
                deadline = time.monotonic() + (sizes.lost_timeout_s if lost else sizes.round_timeout_s)
                one = functools.partial(tx, assets, deadline=deadline, hold_s=cell.hold_ms / 1000)
                for record in round_records(count, deadline, one):
                    print(json.dumps({"cell": cell.index, "party": party, **record}), file=sink, flush=True)
            barrier.arrive(Path(plan.out_dir) / "barriers", f"done-{cell.index}", party)
            _wait(plan, "end", cell, party)


def run_coordinator(plan: Plan) -> None:
    """Party 0: reset before each round, consume, check rows (or count lost events) after."""
    with _engines(plan) as engines, (Path(plan.out_dir) / "cells.jsonl").open("a") as sink:
        for cell in plan.cells:
            engine = engines[cell.url]
            _wait(plan, "warm", cell, 0)
            dataset.reset(engine)
            _wait(plan, "start", cell, 0)
            current = _Round(plan, engine, cell, time.perf_counter())
            measured = (_lost_events_round if cell.scenario == "lost_events" else _contention_round)(current)
            _wait(plan, "end", cell, 0)
            record = {**asdict(cell), "duration_s": current.duration_s, **measured}
            record["planned"] = cell.planned(plan.sizes)
            print(json.dumps(record), file=sink, flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines a party wrote to ``path`` (none if it wrote no file)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cell_started(sync: Path, index: int) -> bool:
    """Whether the coordinator has begun round ``index`` (it arrives at its ``warm`` barrier first)."""
    return barrier.arrived(sync, f"warm-{index}", 0)


@dataclass
class _Round:
    """One round as the coordinator runs it, and the tally of its scheduler side (the ``with_consumer``
    claimer and the ``lost_events`` scheduler differ only in the ``work`` they :meth:`consume`)."""

    plan: Plan
    engine: Engine
    cell: Cell
    started: float
    duration_s: float = 0.0
    #: What the committed consumer transactions took: (asset, DAG) claims or (event, DAG) runs.
    consumed: set[dataset.Pair] = field(default_factory=set)
    #: Claims or runs the committed consumer transactions made.
    made: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def wait_done(self, between: Callable[[], object] = lambda: None, *, pause_s: float = 0.001) -> None:
        """Call ``between`` (a consumer's step) until every producer is done; set :attr:`duration_s`."""
        _wait(self.plan, "done", self.cell, 0, between=between, pause_s=pause_s)
        self.duration_s = time.perf_counter() - self.started

    def consume(self, work: Callable[[Session, list[dataset.Pair]], int], *, deadline: float) -> TxResult:
        """One consumer transaction, retried like a producer's, no hold. ``work`` appends the pairs it
        takes to a list emptied at every attempt and returns the claims or runs it made; only a
        committed transaction's join :attr:`consumed` and :attr:`made`."""
        taken: list[dataset.Pair] = []
        made = [0]

        def attempt(session: Session) -> None:
            taken.clear()
            made[0] = work(session, taken)

        attempts = self.plan.sizes.max_attempts
        result = run_transaction(self.engine, attempt, max_attempts=attempts, deadline=deadline, hold_s=0)
        self.failures.update(result.failures)
        if result.ok:
            self.consumed.update(taken)
            self.made += made[0]
        return result


def _contention_round(current: _Round) -> dict[str, Any]:
    with current.engine.connect() as conn:
        consumers = dataset.consumer_dags(conn, dataset.main_asset_ids(conn))
    consumer: dict[str, Any] = {}
    if current.cell.scenario == "with_consumer":
        # The scheduler: one DAG's claim per step, DAGs in a shuffled round-robin, until its deadline.
        order = sorted(set().union(*consumers.values()))
        process_rng().shuffle(order)
        turns = itertools.cycle(order)
        sizes = current.plan.sizes
        deadline = time.monotonic() + sizes.round_timeout_s + 2 * sizes.lock_timeout_s

        def claim_next() -> None:
            if time.monotonic() < deadline:
                current.consume(functools.partial(_claim, next(turns)), deadline=deadline)

        current.wait_done(claim_next, pause_s=0.002)
        consumer = {"claims": current.made, "failures": dict(current.failures)}
    else:
        current.wait_done()
    # Every producer has written its transactions before arriving at "done".
    emitted: set[dataset.Pair] = set()
    for party in range(1, current.plan.parties):
        for tx in read_jsonl(Path(current.plan.out_dir) / f"tx-{party}.jsonl"):
            if tx["cell"] == current.cell.index and tx["ok"]:
                emitted.update((a, d) for a in tx["assets"] for d in consumers[a])
    with current.engine.connect() as conn:
        queued = dataset.queued_pairs(conn)
    check = dataset.check_rows(queued, emitted, current.consumed)
    return {
        "queued_rows": len(queued),
        "emitted_pairs": len(emitted),
        "consumed_pairs": len(current.consumed),
        "check": check,
        "exact": not any(check.values()),
        "consumer": consumer,
    }


def _claim(dag: str, session: Session, claimed: list[dataset.Pair]) -> int:
    """One ``with_consumer`` claim: the DAG's queue rows (:func:`.scheduler.queued`), a recorded run,
    exactly those rows deleted; the caller commits."""
    conn = session.connection()
    rows = scheduler.queued(conn, dag)
    if not rows:
        return 0
    claimed.extend((a, dag) for a, _ in rows)
    conn.execute(sa.insert(dataset.bench_run).values(dag_id=dag, queued_rows=len(rows)))
    scheduler.delete(conn, dag, rows)
    return 1


def _lost_events_round(current: _Round) -> dict[str, Any]:
    """Consume with Airflow 3.3.2's rule while the producers run, drain, count unconsumed pairs."""
    with current.engine.connect() as conn:
        dags, asset = dataset.lost_dag_ids(conn), dataset.asset(conn, "lost_asset")
        # Airflow's scheduler locks each DAG's ``dag`` row first where it takes row locks at all
        # (not on MariaDB): the same fact that makes "auto" refresh in the producer.
        lock_dag = dialects.get(conn).refresh_by_default(conn)
    pass_ms: list[float] = []

    def one_pass() -> int:
        """One scheduler pass (retried as a whole); the runs it committed."""
        before, deadline = current.made, time.monotonic() + current.plan.barrier_timeout_s
        result = current.consume(
            lambda session, taken: scheduler.recorded_pass(session, dags, taken, lock_dag=lock_dag),
            deadline=deadline,
        )
        pass_ms.append(result.latency_s * 1000)
        return current.made - before

    current.wait_done(one_pass)
    # Drain: every committed queue row becomes a run.
    while one_pass():
        pass
    consumed, consumed_in_round = current.consumed, set(current.consumed)
    # A queue row that already existed kept its created_at (Airflow's ON CONFLICT DO NOTHING / merge), so
    # events after it wait for the next run of that DAG: they are late, not lost. A sentinel event, committed
    # with its queue rows after everything else, triggers that next run; only the pairs it does not pick up
    # either were consumed by no run, ever.
    now, event = utcnow(), scheduler.EVENT
    with current.engine.begin() as conn:
        row = {"asset_id": asset.id, "extra": {}, "timestamp": now, "source_dag_id": "bench_sentinel"}
        key = conn.execute(sa.insert(event).values(**row)).inserted_primary_key
        assert key is not None
        sentinel = int(key[0])
        queue_rows = [{"asset_id": asset.id, "target_dag_id": d, "created_at": now} for d in dags]
        conn.execute(sa.insert(scheduler.ADRQ), queue_rows)
    while one_pass():
        pass
    with current.engine.connect() as conn:
        query = sa.select(event.c.id).where(event.c.asset_id == asset.id, event.c.id != sentinel)
        events = list(conn.scalars(query))
        left = len(dataset.queued_pairs(conn))
    pairs = {(e, d) for e in events for d in dags}
    lost = pairs - consumed
    return {
        "events": len(events),
        "consumers": len(dags),
        "pairs": len(pairs),
        "consumed_pairs": len(pairs & consumed),
        "lost_pairs": len(lost),
        "lost_events": len({e for e, _ in lost}),
        # Consumed only by the sentinel's runs, after the round.
        "late_pairs": len((pairs & consumed) - consumed_in_round),
        "runs": current.made,
        "passes": len(pass_ms),
        "pass_p50_ms": median(pass_ms),
        "pass_max_ms": max(pass_ms, default=float("nan")),
        "queue_rows_left": left,
        "consumer_failures": dict(current.failures),
        # Consumed pairs that are neither this round's events nor the sentinel: must be 0.
        "consumed_unknown": len({(e, d) for e, d in consumed if e != sentinel} - pairs),
    }


#: Seconds a sweep cell may take (projected from the previous fan-out) before it is skipped.
SWEEP_BUDGET_S = 20.0
#: Reports what a one-caller measurement is doing: ``step(note, advance)`` (:meth:`.progress.Task.step`).
Step = Callable[[str, float], None]


def _timed(engine: Engine, call: Callable[[], object], fanout: int) -> tuple[float, int, bool]:
    """One ``call`` on a queue emptied untimed: seconds, statements, whether it queued ``fanout`` rows."""
    dataset.reset(engine)
    counting.reset()
    start = time.perf_counter()
    call()
    elapsed, statements = time.perf_counter() - start, counting.value()
    with engine.connect() as conn:
        return elapsed, statements, len(dataset.queued_pairs(conn)) == fanout


def _measure(
    engine: Engine, calls: dict[str, Callable[[], object]], fanout: int, repeats: int, rng: random.Random
) -> dict[str, Any]:
    """Time ``calls`` (column prefix -> call) with :func:`_timed`: one untimed call of each, then
    ``repeats`` of each, the calls of a repeat in random order. Each call's latency columns
    (:func:`.stats.latency`, ms) and ``statements`` (of its last call), after its prefix;
    ``rows_exact``: every timed call queued ``fanout`` rows."""
    for call in calls.values():
        _timed(engine, call, fanout)  # warm-up: compilation and ORM set-up are one-off costs
    timed: dict[str, list[tuple[float, int, bool]]] = {prefix: [] for prefix in calls}
    for _ in range(repeats):
        for prefix in rng.sample(list(calls), len(calls)):
            timed[prefix].append(_timed(engine, calls[prefix], fanout))
    row: dict[str, Any] = {}
    for prefix, runs in timed.items():
        row.update(latency([t * 1000 for t, _, _ in runs], prefix))
        row[f"{prefix}statements"] = runs[-1][1]
    row["rows_exact"] = all(ok for runs in timed.values() for *_, ok in runs)
    return row


def _commit(engine: Engine, emit: strategies.Emit, asset: dataset.SeedAsset, rng: random.Random) -> None:
    with Session(engine) as session:
        emit(session, [asset], rng)
        session.commit()


@contextlib.contextmanager
def _one_caller(
    url: str, sizes: Sizes, fanouts: Iterable[int]
) -> Iterator[tuple[Engine, dict[int, dataset.SeedAsset]]]:
    """The sweep's or the ratio's engine and ``sweep_<F>`` assets; the queue emptied after."""
    engine = dataset.bench_engine(url, lock_timeout_s=sizes.lock_timeout_s)
    try:
        with engine.connect() as conn:
            asset_of = {f: dataset.asset(conn, f"sweep_{f}") for f in fanouts}
        yield engine, asset_of
    finally:
        dataset.reset(engine)
        engine.dispose()


def run_sweep(url: str, sizes: Sizes, strategy_names: Iterable[str], *, step: Step) -> list[dict[str, Any]]:
    """Single-caller latency of one ``register_asset_change`` + COMMIT on an empty queue, per fan-out:
    strategies in random order, each (strategy, fan-out) after one untimed call, skipped (the row says
    so) when its time projected from the previous fan-out exceeds :data:`SWEEP_BUDGET_S`. A row has
    the median (``latency_s``) and the spread (``p25_ms``, ``p75_ms`` ...) of ``sweep_repeats`` calls."""
    results: list[dict[str, Any]] = []
    rng, names = process_rng(), list(strategy_names)
    rng.shuffle(names)
    with _one_caller(url, sizes, sizes.sweep) as (engine, asset_of):
        for name in names:
            emit, previous = strategies.get(name), (1, 0.0)
            for fanout in sorted(sizes.sweep):
                row: dict[str, Any] = {"strategy": name, "fanout": fanout}
                step(f"{name} F={fanout}", 0)
                if previous[1] * fanout / previous[0] * (sizes.sweep_repeats + 1) > SWEEP_BUDGET_S:
                    row["skipped"] = f"projected over {SWEEP_BUDGET_S:.0f} s"
                else:
                    call = functools.partial(_commit, engine, emit, asset_of[fanout], rng)
                    row.update(_measure(engine, {"": call}, fanout, sizes.sweep_repeats, rng))
                    row["latency_s"] = row["p50_ms"] / 1000
                    previous = (fanout, row["latency_s"])
                results.append(row)
                step(f"{name} F={fanout}" + (" skipped" if "skipped" in row else ""), 1)
    return results


def run_raw_ratio(url: str, sizes: Sizes, *, step: Step) -> list[dict[str, Any]]:
    """``register_asset_change`` + COMMIT (commit mode) against the same work in raw SQL (:mod:`.rawsql`
    on one ``raw_connection()``, the same driver), ``ratio_calls`` of each per fan-out (:func:`_measure`):
    each side's latency columns (``ours_p50_ms``, ``raw_p25_ms`` ...), statements per call, the ratios
    of the medians and of the p95s."""
    results: list[dict[str, Any]] = []
    task, rng = strategies.TASK, process_rng()
    with (
        _one_caller(url, sizes, sizes.ratio_fanouts) as (engine, asset_of),
        contextlib.closing(engine.raw_connection()) as raw_connection,
    ):
        raw = rawsql.raw_sql(engine.dialect)
        hand_written = functools.partial(raw.register, raw_connection, source=asdict(task))

        def ours(session: Session, assets: Sequence[Any], _rng: random.Random) -> None:
            airflow_adrq.register_asset_change(asset=assets[0], task_instance=task, session=session)

        for fanout in sorted(sizes.ratio_fanouts):
            step(f"F={fanout}", 0)
            asset = asset_of[fanout]
            calls: dict[str, Callable[[], object]] = {
                "ours_": functools.partial(_commit, engine, ours, asset, rng),
                "raw_": functools.partial(hand_written, name=asset.name, uri=asset.uri),
            }
            row: dict[str, Any] = {"fanout": fanout, "calls": sizes.ratio_calls}
            row.update(_measure(engine, calls, fanout, sizes.ratio_calls, rng))
            # The raw side goes around SQLAlchemy's cursor events: its statements are its own count, the
            # lookup, the event and its steps (COMMIT not counted, as airflow_adrq_testing.recording counts).
            row["raw_statements"] = 2 + len(raw.steps)
            row.update({f"ratio_p{q}": row[f"ours_p{q}_ms"] / row[f"raw_p{q}_ms"] for q in (50, 95)})
            results.append(row)
            step(f"F={fanout}", 1)
    return results
