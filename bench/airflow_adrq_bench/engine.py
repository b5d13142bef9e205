"""Producer, consumer and coordinator loops, the fan-out sweep and the raw-SQL ratio.

One process per party (the pytest-xdist suite gives each its own worker):

* party 0, the coordinator: empties the queue before every round, acts as
  the scheduler in ``with_consumer`` and ``lost_events`` rounds, and checks
  the rows after the round;
* parties 1..N, the producers: run the round's producer transactions, each
  retried as a whole on a deadlock, lock timeout, serialization failure or
  SQLite busy error, and append one JSON line per transaction to
  ``tx-<party>.jsonl``. A round may use fewer producers than there are
  parties; the others only pass its barriers.

Every round (cell) goes: each taking part producer runs one warm-up
transaction of the cell's strategy on its own warm-up assets (so statement
compilation and ORM set-up are not timed, and nothing the round uses is
touched); barrier ``warm``; the coordinator empties the queue, the events
and the runs; barrier ``start``; the round; ``done``; barrier ``end``.

A producer transaction is what task success does to the queue: per emitted
asset the strategy's whole ``register_asset_change`` (lookup, event, consumers,
queue), then stay open ``hold_ms`` (the rest of the task-success
transaction), then COMMIT.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq.models import AssetDagRunQueue, AssetEvent, DagScheduleAssetReference, UtcDateTime, utcnow
from airflow_adrq_bench import barrier, dataset, rawsql, strategies
from airflow_adrq_bench.config import COMMITTED, GAVE_UP, NOT_STARTED, Cell, Plan, Sizes
from airflow_adrq_bench.stats import percentile
from airflow_adrq_testing.recording import counting

__all__ = [
    "COMMITTED",
    "GAVE_UP",
    "GAVE_UP_ATTEMPTS",
    "GAVE_UP_STOPPED",
    "GAVE_UP_TIMEOUT",
    "NOT_STARTED",
    "TxResult",
    "cell_started",
    "emitted_assets",
    "process_rng",
    "producer_work",
    "round_records",
    "run_coordinator",
    "run_producer",
    "run_raw_ratio",
    "run_sweep",
    "run_transaction",
    "scheduler_pass",
]

_ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)
_EVENT = cast(sa.Table, AssetEvent.__table__)
_REF = cast(sa.Table, DagScheduleAssetReference.__table__)


def process_rng() -> random.Random:
    """A generator seeded from ``os.urandom``: every process gets its own order.

    This is what models the order a Python ``set`` of freshly loaded
    ``DagModel`` objects iterates in (see :mod:`airflow_adrq_bench.baselines`);
    it does not depend on ``PYTHONHASHSEED``, which pytest-xdist and plugins
    may pin.
    """
    return random.Random(int.from_bytes(os.urandom(8), "big"))


# --- one producer transaction ---------------------------------------------------


#: Why :func:`run_transaction` gave up (``TxResult.gave_up``).
GAVE_UP_ATTEMPTS = "max attempts"
GAVE_UP_TIMEOUT = "round timeout"
GAVE_UP_STOPPED = "stopped"


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
    #: Not committed: why it stopped retrying (:data:`GAVE_UP_ATTEMPTS`,
    #: :data:`GAVE_UP_TIMEOUT` or :data:`GAVE_UP_STOPPED`); ``None`` if it committed.
    gave_up: str | None = None
    #: The failure kind of the last failed attempt (``None`` if none failed).
    last_failure: str | None = None

    @property
    def outcome(self) -> str:
        return COMMITTED if self.ok else GAVE_UP


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

    After a failed attempt it gives up once ``max_attempts`` attempts were
    made, once ``time.monotonic()`` has passed ``deadline``, or when
    ``give_up()`` says so (in that order; ``TxResult.gave_up`` says which).
    Other errors propagate.
    """
    failures: Counter[str] = Counter()
    last: str | None = None
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
            retryable = airflow_adrq.classify(exc)
            if retryable is None:
                raise
            kind = last = retryable.kind.value
            failures[kind] += 1
            reason = (
                GAVE_UP_ATTEMPTS
                if attempt >= max_attempts
                else GAVE_UP_TIMEOUT
                if time.monotonic() > deadline
                else GAVE_UP_STOPPED
                if give_up()
                else None
            )
            if reason is not None:
                elapsed = time.perf_counter() - start
                return TxResult(False, attempt, elapsed, 0, list(assets), dict(failures), reason, kind)
            # Jittered backoff, so two victims do not restart in lockstep.
            time.sleep(rng.uniform(0, min(0.05, 0.005 * attempt)))
            continue
        elapsed = time.perf_counter() - start
        return TxResult(True, attempt, elapsed, counting.value(), list(assets), dict(failures), None, last)


def producer_work(
    emit: strategies.Emit, assets: Sequence[dataset.SeedAsset], rng: random.Random
) -> Callable[[Session], None]:
    """The strategy's whole ``register_asset_change`` for each asset, in this order."""

    def work(session: Session) -> None:
        emit(session, assets, rng)

    return work


def emitted_assets(
    scenario: str, assets: Sequence[dataset.SeedAsset], rng: random.Random
) -> list[dataset.SeedAsset]:
    """The assets one transaction emits: the first, or all outlets in random order."""
    if scenario in ("single", "lost_events"):
        return [assets[0]]
    emitted = list(assets)
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


class _Party:
    """What every party's loop takes from the plan, its own generator and engines, and its barriers."""

    def __init__(self, plan: Plan) -> None:
        self.sizes = plan.sizes
        self.out = Path(plan.out_dir)
        self.sync = self.out / "barriers"
        self.rng = process_rng()
        self.engines = _Engines(plan.sizes)
        self.parties = plan.parties
        self.timeout = plan.barrier_timeout_s

    def wait(self, name: str, cell: Cell, party: int) -> None:
        """Wait at barrier ``name`` of ``cell`` until every party has arrived."""
        barrier.wait(self.sync, f"{name}-{cell.index}", party, self.parties, timeout_s=self.timeout)


def _round_assets(
    conn: Connection, cell: Cell, party: int
) -> tuple[list[dataset.SeedAsset], list[dataset.SeedAsset]]:
    """(the assets the round emits, this party's warm-up assets)."""
    if cell.scenario == "lost_events":
        return [dataset.lost_asset(conn)], [dataset.lost_warm_asset(conn, party)]
    return dataset.main_assets(conn), dataset.warm_assets(conn, party)


def run_producer(plan: Plan, party: int) -> None:
    """Party ``party`` (1..N): every round it takes part in, warm up, then run its transactions."""
    this = _Party(plan)
    sizes, out, sync, rng, engines = this.sizes, this.out, this.sync, this.rng, this.engines
    try:
        with (out / f"tx-{party}.jsonl").open("a") as sink:
            for cell in plan.cells:
                active = party <= cell.producers
                if active:
                    engine = engines.get(cell.url)
                    with engine.connect() as conn:
                        assets, warm = _round_assets(conn, cell, party)
                    emit = strategies.get(cell.strategy)
                    warm_up = emitted_assets(cell.scenario, warm, rng)
                    run_transaction(
                        engine,
                        producer_work(emit, warm_up, rng),
                        max_attempts=sizes.max_attempts,
                        deadline=time.monotonic() + this.timeout,
                        hold_s=0,
                        rng=rng,
                    )
                this.wait("warm", cell, party)
                this.wait("start", cell, party)
                if active:
                    if cell.scenario == "lost_events":
                        count = _share(sizes.lost_events, cell.producers, party)
                        deadline = time.monotonic() + sizes.lost_timeout_s
                    else:
                        count = sizes.transactions
                        deadline = time.monotonic() + sizes.round_timeout_s
                    one = functools.partial(
                        _producer_transaction, engine, emit, cell, assets, sizes, deadline, rng
                    )
                    for record in round_records(count, deadline, one):
                        sink.write(json.dumps({"cell": cell.index, "party": party, **record}) + "\n")
                        sink.flush()
                barrier.arrive(sync, f"done-{cell.index}", party)
                this.wait("end", cell, party)
    finally:
        engines.close()


def _producer_transaction(
    engine: Engine,
    emit: strategies.Emit,
    cell: Cell,
    assets: Sequence[dataset.SeedAsset],
    sizes: Sizes,
    deadline: float,
    rng: random.Random,
) -> TxResult:
    emitted = emitted_assets(cell.scenario, assets, rng)
    return run_transaction(
        engine,
        producer_work(emit, emitted, rng),
        max_attempts=sizes.max_attempts,
        deadline=deadline,
        hold_s=cell.hold_ms / 1000,
        rng=rng,
        assets=[a.id for a in emitted],
    )


def round_records(
    count: int,
    deadline: float,
    run_one: Callable[[], TxResult],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[dict[str, Any]]:
    """One record per planned transaction of a producer's round, in order: exactly ``count``.

    Runs ``run_one()`` for each transaction started before ``deadline``
    (``outcome`` committed or gave up); once the deadline has passed, the
    rest are recorded as ``not started``. So committed + gave up + not
    started always adds up to the plan.
    """
    for done in range(count):
        if clock() > deadline:
            for _ in range(count - done):
                yield {**asdict(TxResult(False, 0, 0.0, 0, [])), "outcome": NOT_STARTED}
            return
        result = run_one()
        yield {**asdict(result), "outcome": result.outcome}


def _share(total: int, producers: int, party: int) -> int:
    """Party ``party``'s part of ``total`` transactions split over ``producers`` (1-based)."""
    return total // producers + (1 if party <= total % producers else 0)


def run_coordinator(plan: Plan) -> None:
    """Party 0: reset before each round, consume, check rows (or count lost events) after."""
    this = _Party(plan)
    sizes, out, sync, rng, engines = this.sizes, this.out, this.sync, this.rng, this.engines
    try:
        with (out / "cells.jsonl").open("a") as sink:
            for cell in plan.cells:
                engine = engines.get(cell.url)
                this.wait("warm", cell, 0)
                dataset.reset(engine)
                this.wait("start", cell, 0)
                current = _Round(
                    engine, sync, cell, sizes, this.parties, rng, time.perf_counter(), this.timeout
                )
                if cell.scenario == "lost_events":
                    record = _lost_events_round(current)
                else:
                    record = _contention_round(current, out)
                this.wait("end", cell, 0)
                record["planned"] = cell.planned(sizes)
                sink.write(json.dumps(record) + "\n")
                sink.flush()
    finally:
        engines.close()


def cell_started(sync: Path, index: int) -> bool:
    """Whether the coordinator has begun round ``index`` (it arrives at its ``warm`` barrier first)."""
    return barrier.arrived(sync, f"warm-{index}", 1) == 1


@dataclass
class _Round:
    """One round as the coordinator runs it, and the tally of its scheduler side.

    The ``with_consumer`` claimer and the ``lost_events`` scheduler differ only
    in what one of their transactions does: both run it through
    :meth:`consume` and interleave it with the wait for the producers in
    :meth:`wait_done`.
    """

    engine: Engine
    sync: Path
    cell: Cell
    sizes: Sizes
    parties: int
    rng: random.Random
    started: float
    #: Seconds after ``started`` when the producers count as stuck.
    timeout: float
    #: What the committed consumer transactions took: (asset, DAG) claims or (event, DAG) runs.
    consumed: set[dataset.Pair] = field(default_factory=set)
    #: Failed consumer attempts, by kind.
    failures: Counter[str] = field(default_factory=Counter)

    def producers_done(self) -> bool:
        return barrier.arrived(self.sync, f"done-{self.cell.index}", self.parties) >= self.parties - 1

    def wait_done(self, between: Callable[[], object] = lambda: None, *, pause_s: float = 0.001) -> float:
        """Call ``between`` (a consumer's step) until every producer is done; returns the round's duration.

        Raises :class:`barrier.BarrierTimeoutError` once ``timeout`` has passed.
        """
        while not self.producers_done():
            if time.perf_counter() - self.started > self.timeout:
                raise barrier.BarrierTimeoutError(f"producers did not finish {self.cell.label}")
            between()
            time.sleep(pause_s)
        return time.perf_counter() - self.started

    def consume(
        self, work: Callable[[Session, list[dataset.Pair]], int], *, deadline: float
    ) -> tuple[TxResult, int]:
        """One consumer transaction, retried like a producer's but not held open before COMMIT.

        ``work`` appends the pairs it takes to the list it is given (empty at
        every attempt) and returns how many claims or runs it made. Returns the
        transaction's result and that count; only a committed transaction's
        pairs join :attr:`consumed`, and a transaction that did not commit made 0.
        """
        taken: list[dataset.Pair] = []
        made = [0]

        def attempt(session: Session) -> None:
            taken.clear()
            made[0] = work(session, taken)

        result = run_transaction(
            self.engine,
            attempt,
            max_attempts=self.sizes.max_attempts,
            deadline=deadline,
            hold_s=0,
            rng=self.rng,
        )
        self.failures.update(result.failures)
        if not result.ok:
            return result, 0
        self.consumed.update(taken)
        return result, made[0]


def _contention_round(current: _Round, out: Path) -> dict[str, Any]:
    with current.engine.connect() as conn:
        asset_ids = dataset.main_asset_ids(conn)
        consumers = dataset.consumer_dags(conn, asset_ids)
    consumer: dict[str, Any] = {}
    if current.cell.scenario == "with_consumer":
        claimer = _Claimer(current, sorted(set().union(*consumers.values())))
        duration = current.wait_done(claimer, pause_s=0.002)
        consumer = {"claims": claimer.claims, "failures": dict(current.failures)}
    else:
        duration = current.wait_done()
    # Every producer has written its transactions before arriving at "done".
    emitted = _emitted_pairs(out, current.cell, current.parties - 1, consumers)
    with current.engine.connect() as conn:
        queued = dataset.queued_pairs(conn)
    check = dataset.check_rows(queued, emitted, current.consumed)
    return {
        **asdict(current.cell),
        "duration_s": duration,
        "queued_rows": len(queued),
        "emitted_pairs": len(emitted),
        "consumed_pairs": len(current.consumed),
        "check": check,
        "exact": not any(check.values()),
        "consumer": consumer,
    }


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


class _Claimer:
    """The ``with_consumer`` scheduler: each call claims one DAG's queue rows, until its deadline.

    The DAGs are taken in a shuffled round-robin. A claim is one transaction:
    the DAG's queue rows ``FOR UPDATE SKIP LOCKED`` (as Airflow 3.3's
    ``_create_dag_runs_asset_triggered``; SQLite has no row locks and ignores
    the clause, BEGIN IMMEDIATE serialises instead), a recorded run, exactly
    the claimed rows deleted, COMMIT.
    """

    def __init__(self, current: _Round, dags: Sequence[str]) -> None:
        self.round = current
        self.order = list(dags)
        current.rng.shuffle(self.order)
        sizes = current.sizes
        self.deadline = time.monotonic() + sizes.round_timeout_s + 2 * sizes.lock_timeout_s
        self.turn = 0
        self.claims = 0

    def __call__(self) -> None:
        if time.monotonic() >= self.deadline:
            return
        dag = self.order[self.turn % len(self.order)]
        self.turn += 1
        _, made = self.round.consume(functools.partial(_claim, dag), deadline=self.deadline)
        self.claims += made


def _claim(dag: str, session: Session, claimed: list[dataset.Pair]) -> int:
    """Claim ``dag``'s queue rows into ``claimed``, record a run, delete them; 1 if there were any."""
    rows = session.execute(
        sa.select(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id)
        .where(_ADRQ.c.target_dag_id == dag)
        .order_by(_ADRQ.c.created_at.desc())
        .with_for_update(skip_locked=True)
    ).all()
    if not rows:
        return 0
    claimed.extend((int(a), str(d)) for a, d in rows)
    session.execute(sa.insert(dataset.bench_run).values(dag_id=dag, queued_rows=len(rows)))
    session.execute(sa.delete(_ADRQ).where(sa.tuple_(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id).in_(claimed)))
    return 1


# --- lost events: Airflow 3.3.2's scheduler rule ----------------------------------

#: The floor of last resort (Airflow: ``date.min``); UtcDateTime needs an aware value.
_FLOOR = dt.datetime(1970, 1, 2, tzinfo=dt.timezone.utc)


def scheduler_pass(session: Session, dags: Sequence[str], consumed: list[tuple[int, str]]) -> int:
    """One pass of Airflow 3.3.2's ``_create_dag_runs_asset_triggered`` over ``dags``; returns runs created.

    Per DAG, as the scheduler does (catchup off): ``SELECT ... FROM
    asset_dag_run_queue WHERE target_dag_id = :dag ORDER BY created_at DESC
    FOR UPDATE SKIP LOCKED`` (SQLite: no lock clause); nothing → next DAG;
    ``triggered_date`` = the newest ``created_at``; the run consumes the
    events of the DAG's assets with ``floor < timestamp <= triggered_date``,
    floor = ``coalesce(max(run_after) of the DAG's earlier runs below
    triggered_date, min(created_at) of its schedule references)``; the run
    is recorded with ``run_after = triggered_date``; the locked queue rows
    are deleted. The caller commits (Airflow commits once per scheduler loop).
    Appends ``(event_id, dag_id)`` to ``consumed``.
    """
    runs = 0
    for dag in dags:
        rows = session.execute(
            sa.select(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id, _ADRQ.c.created_at)
            .where(_ADRQ.c.target_dag_id == dag)
            .order_by(_ADRQ.c.created_at.desc())
            .with_for_update(skip_locked=True)
        ).all()
        if not rows:
            continue
        triggered_date = rows[0].created_at
        previous = (
            sa.select(sa.func.max(dataset.bench_run.c.run_after))
            .where(dataset.bench_run.c.dag_id == dag, dataset.bench_run.c.run_after < triggered_date)
            .scalar_subquery()
        )
        first_reference = (
            sa.select(sa.func.min(_REF.c.created_at)).where(_REF.c.dag_id == dag).scalar_subquery()
        )
        floor = sa.func.coalesce(
            previous, first_reference, sa.bindparam("floor", _FLOOR, type_=UtcDateTime())
        )
        event_ids = session.scalars(
            sa.select(_EVENT.c.id)
            .where(
                _EVENT.c.asset_id.in_(sa.select(_REF.c.asset_id).where(_REF.c.dag_id == dag)),
                _EVENT.c.timestamp <= triggered_date,
                _EVENT.c.timestamp > floor,
            )
            .order_by(_EVENT.c.timestamp.asc(), _EVENT.c.id.asc())
        ).all()
        session.execute(
            sa.insert(dataset.bench_run).values(
                dag_id=dag, queued_rows=len(rows), run_after=triggered_date, consumed_events=len(event_ids)
            )
        )
        consumed.extend((int(e), dag) for e in event_ids)
        session.execute(
            sa.delete(_ADRQ).where(
                sa.tuple_(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id).in_(
                    [(r.asset_id, r.target_dag_id) for r in rows]
                )
            )
        )
        runs += 1
    return runs


def _lost_events_round(current: _Round) -> dict[str, Any]:
    """Consume with Airflow 3.3.2's rule while the producers run, drain, count unconsumed pairs."""
    with current.engine.connect() as conn:
        dags = dataset.lost_dag_ids(conn)
        asset = dataset.lost_asset(conn)
    runs = 0
    pass_ms: list[float] = []

    def one_pass() -> int:
        nonlocal runs
        result, made = current.consume(
            lambda session, taken: scheduler_pass(session, dags, taken),
            deadline=time.monotonic() + current.timeout,
        )
        pass_ms.append(result.latency_s * 1000)
        runs += made
        return made

    duration = current.wait_done(one_pass)
    # Drain: every committed queue row becomes a run.
    while one_pass():
        pass
    consumed = current.consumed
    consumed_in_round = set(consumed)
    # A queue row that already existed kept its created_at (Airflow's ON
    # CONFLICT DO NOTHING / merge), so events after it wait for the next run
    # of that DAG: they are late, not lost. A sentinel event, committed with
    # its queue rows after everything else, triggers that next run; only the
    # pairs it does not pick up either were consumed by no run, ever.
    with Session(current.engine) as session:
        sentinel = _sentinel_event(session, asset.id, dags)
        session.commit()
    while one_pass():
        pass
    with current.engine.connect() as conn:
        events = list(
            conn.scalars(sa.select(_EVENT.c.id).where(_EVENT.c.asset_id == asset.id, _EVENT.c.id != sentinel))
        )
        left = len(dataset.queued_pairs(conn))
    pairs = {(e, d) for e in events for d in dags}
    lost = pairs - consumed
    return {
        **asdict(current.cell),
        "duration_s": duration,
        "events": len(events),
        "consumers": len(dags),
        "pairs": len(pairs),
        "consumed_pairs": len(pairs & consumed),
        "lost_pairs": len(lost),
        "lost_events": len({e for e, _ in lost}),
        # Consumed only by the sentinel's runs, after the round.
        "late_pairs": len((pairs & consumed) - consumed_in_round),
        "runs": runs,
        "passes": len(pass_ms),
        "pass_p50_ms": statistics.median(pass_ms) if pass_ms else math.nan,
        "pass_max_ms": max(pass_ms, default=math.nan),
        "queue_rows_left": left,
        "consumer_failures": dict(current.failures),
        # Consumed pairs that are neither this round's events nor the sentinel: must be 0.
        "consumed_unknown": len({(e, d) for e, d in consumed if e != sentinel} - pairs),
    }


def _sentinel_event(session: Session, asset_id: int, dags: Sequence[str]) -> int:
    """Insert one event of ``asset_id`` and its queue rows, all stamped now; returns the event id."""
    now = utcnow()
    result = cast(
        "sa.CursorResult[Any]",
        session.execute(
            sa.insert(_EVENT).values(
                asset_id=asset_id, extra={}, timestamp=now, source_dag_id="bench_sentinel"
            )
        ),
    )
    key = result.inserted_primary_key
    assert key is not None
    event_id = int(key[0])
    session.execute(
        sa.insert(_ADRQ), [{"asset_id": asset_id, "target_dag_id": d, "created_at": now} for d in dags]
    )
    return event_id


# --- fan-out sweep --------------------------------------------------------------


def _reset_and_count(engine: Engine) -> None:
    dataset.reset(engine)
    counting.reset()


def run_sweep(
    url: str,
    sizes: Sizes,
    strategy_names: Iterable[str],
    *,
    budget_s: float = 20.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Single-caller latency of one ``register_asset_change`` + COMMIT on an empty queue, per fan-out.

    Strategies run in random order; every (strategy, fan-out) is warmed up
    with one untimed call first. Skips a (strategy, fan-out) whose projected
    time (from the previous fan-out, linearly) exceeds ``budget_s``; the row
    says so.
    """
    engine = dataset.bench_engine(url, lock_timeout_s=sizes.lock_timeout_s)
    rng = process_rng()
    results: list[dict[str, Any]] = []
    names = list(strategy_names)
    rng.shuffle(names)
    try:
        with engine.connect() as conn:
            asset_of = {f: dataset.sweep_asset(conn, f) for f in sizes.sweep}
        for name in names:
            emit = strategies.get(name)
            previous: tuple[int, float] | None = None
            for fanout in sorted(sizes.sweep):
                row: dict[str, Any] = {"strategy": name, "fanout": fanout}
                projected = (
                    previous[1] * fanout / previous[0] * (sizes.sweep_repeats + 1) if previous else 0.0
                )
                if projected > budget_s:
                    row["skipped"] = f"projected over {budget_s:.0f} s"
                    results.append(row)
                    continue
                if progress:
                    progress(f"sweep {name} fan-out {fanout}")
                asset = [asset_of[fanout]]
                # Warm-up: statement compilation and ORM set-up are one-off costs.
                _reset_and_count(engine)
                with Session(engine) as session:
                    emit(session, asset, rng)
                    session.commit()
                latencies, statements, rows_ok = [], 0, True
                for _ in range(sizes.sweep_repeats):
                    _reset_and_count(engine)
                    start = time.perf_counter()
                    with Session(engine) as session:
                        emit(session, asset, rng)
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


def run_raw_ratio(
    url: str,
    sizes: Sizes,
    *,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """``register_asset_change`` + COMMIT against the same work in raw SQL, interleaved call by call.

    Per fan-out in ``sizes.ratio_fanouts``: one untimed call of each side,
    then ``ratio_calls`` pairs, each pair in random order, every call on an
    empty queue (emptied untimed). Ours: ``with Session(engine) as s:
    register_asset_change(asset=..., session=s); s.commit()`` (commit mode).
    Raw SQL: :mod:`.rawsql` on one ``engine.raw_connection()``, through the
    same driver. Reports median and p95 of each, their ratios, and
    statements per call.
    """
    engine = dataset.bench_engine(url, lock_timeout_s=sizes.lock_timeout_s)
    rng = process_rng()
    task = strategies.TASK
    source = (task.dag_id, task.task_id, task.run_id, task.map_index)
    results: list[dict[str, Any]] = []
    raw_connection = engine.raw_connection()
    try:
        raw = rawsql.raw_sql(engine.dialect)
        with engine.connect() as conn:
            asset_of = {f: dataset.sweep_asset(conn, f) for f in sizes.ratio_fanouts}

        def ours(asset: dataset.SeedAsset) -> None:
            with Session(engine) as session:
                airflow_adrq.register_asset_change(asset=asset, task_instance=task, session=session)
                session.commit()

        def hand_written(asset: dataset.SeedAsset) -> None:
            raw.register(raw_connection, name=asset.name, uri=asset.uri, source=source)

        sides: dict[str, Callable[[dataset.SeedAsset], None]] = {"ours": ours, "raw": hand_written}
        for fanout in sorted(sizes.ratio_fanouts):
            if progress:
                progress(f"raw-SQL ratio, fan-out {fanout}")
            asset = asset_of[fanout]
            latencies: dict[str, list[float]] = {"ours": [], "raw": []}
            statements: dict[str, int] = {}
            exact = True
            for call in sides.values():  # warm-up
                _reset_and_count(engine)
                call(asset)
            for _ in range(sizes.ratio_calls):
                order = list(sides)
                rng.shuffle(order)
                for side in order:
                    _reset_and_count(engine)
                    start = time.perf_counter()
                    sides[side](asset)
                    latencies[side].append(time.perf_counter() - start)
                    # The raw side goes around SQLAlchemy's cursor events.
                    statements[side] = counting.value() if side == "ours" else rawsql.STATEMENTS_PER_CALL
                    with engine.connect() as conn:
                        exact = exact and len(dataset.queued_pairs(conn)) == fanout
            row: dict[str, Any] = {"fanout": fanout, "calls": sizes.ratio_calls, "rows_exact": exact}
            for side in sides:
                ms = [s * 1000 for s in latencies[side]]
                row[f"{side}_p50_ms"] = statistics.median(ms)
                row[f"{side}_p95_ms"] = percentile(ms, 95)
                row[f"{side}_statements"] = statements[side]
            row["ratio_p50"] = row["ours_p50_ms"] / row["raw_p50_ms"]
            row["ratio_p95"] = row["ours_p95_ms"] / row["raw_p95_ms"]
            results.append(row)
    finally:
        raw_connection.close()
        dataset.reset(engine)
        engine.dispose()
    return results
