"""What is left of the timing race: producers with *disjoint* rows feeding one DAG, with a scheduler running.

::

    python -m airflow_adrq_bench.residual --db postgresql://root@127.0.0.1/postgres [--seconds 20]

Producers sharing a queue row are stamped in commit order (the stamp is read
once the rows are locked). Producers of *different* assets feeding one DAG
share no row: one can be stamped, another stamped later and committed, and a
scheduler read between them, all before the first one's COMMIT is visible;
the run's window then covers the first event's stamp without it, and the next
window starts after it. How often, here: ``--producers`` threads, each
emitting its own asset in a loop, one consumer DAG scheduled on all of them,
and Airflow 3.3.2's scheduler step (:func:`scheduler_pass`) in a loop, with
``FOR UPDATE SKIP LOCKED`` (PostgreSQL, MySQL 8) or without row locks
(``--no-row-locks``: MariaDB's). Then the queue is drained and every event's
runs are counted. Side by side: airflow-adrq's protocol (lock, stamp from the
database's clock, COMMIT) and the one before it (:func:`stamp_first`), each
on its own scratch database. Also the window itself: the time from the
stamp to the moment the commit is visible to another connection.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, migrate, register_asset_change
from airflow_adrq.dialects import ConflictPolicy
from airflow_adrq.models import (
    AssetActive,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagBundleModel,
    DagModel,
    DagScheduleAssetReference,
    utcnow,
)
from airflow_adrq.queue import build_queue_statement
from airflow_adrq.retry import RetryableKind, classify
from airflow_adrq_testing import servers

__all__ = ["Outcome", "Run", "main", "measure", "scheduler_pass", "stamp_first"]

_ADRQ = cast(sa.Table, AssetDagRunQueue.__table__)
_EVENT = cast(sa.Table, AssetEvent.__table__)
_REF = cast(sa.Table, DagScheduleAssetReference.__table__)
_DAG = cast(sa.Table, DagModel.__table__)

#: The ``(run_after, consumed event ids)`` of one DAG run.
Run = tuple[dt.datetime, list[int]]


def scheduler_pass(
    conn: sa.Connection, dag_id: str, *, locks: bool, runs: Sequence[Run], lock_dag: bool = True
) -> Run | None:
    """Airflow 3.3.2's scheduler for one DAG, on ``conn``'s open transaction; the run it would create.

    ``dags_needing_dagruns`` first takes the DAG's ``dag`` row (``FOR NO
    KEY UPDATE SKIP LOCKED``; MySQL ``FOR UPDATE SKIP LOCKED``) with
    ``locks`` and ``lock_dag``: a DAG whose row another transaction holds
    is skipped this pass (on InnoDB that includes a producer whose insert's
    FK check share-locked it). Then ``_create_dag_runs_asset_triggered``:
    take the DAG's queue rows (``FOR UPDATE SKIP LOCKED`` with ``locks``),
    ``triggered_date`` = their newest ``created_at``, the events of the DAG's
    assets with ``floor < timestamp <= triggered_date`` (floor: the newest
    earlier run's ``run_after`` below it), delete exactly the rows taken.
    The caller records the run once the transaction committed.
    """
    if locks and lock_dag:
        dag = sa.select(_DAG.c.dag_id).where(_DAG.c.dag_id == dag_id)
        if conn.execute(dag.with_for_update(skip_locked=True, key_share=True)).first() is None:
            return None
    query = sa.select(_ADRQ.c.asset_id, _ADRQ.c.created_at).where(_ADRQ.c.target_dag_id == dag_id)
    query = query.order_by(_ADRQ.c.created_at.desc())
    if locks:
        query = query.with_for_update(skip_locked=True)
    queued = conn.execute(query).all()
    if not queued:
        return None
    triggered: dt.datetime = queued[0].created_at
    earlier = [run_after for run_after, _ in runs if run_after < triggered]
    window = [_EVENT.c.timestamp <= triggered]
    if earlier:
        window.append(_EVENT.c.timestamp > max(earlier))
    assets = sa.select(_REF.c.asset_id).where(_REF.c.dag_id == dag_id)
    consumed = conn.execute(
        sa.select(_EVENT.c.id).where(_EVENT.c.asset_id.in_(assets), *window).order_by(_EVENT.c.id)
    ).scalars()
    events = list(consumed)
    locked = [row.asset_id for row in queued]
    conn.execute(sa.delete(_ADRQ).where(_ADRQ.c.target_dag_id == dag_id, _ADRQ.c.asset_id.in_(locked)))
    return triggered, events


def stamp_first(session: Session, asset_ids: Sequence[int]) -> list[int]:
    """The protocol before the fix: the events, Python's clock on them, then the statement; COMMIT."""
    conn = session.connection()
    insert = sa.insert(_EVENT).returning(_EVENT.c.id)
    ids = [
        conn.execute(insert.values(asset_id=a, extra={}, timestamp=utcnow())).scalar_one() for a in asset_ids
    ]
    stamp = utcnow()
    conn.execute(sa.update(_EVENT).where(_EVENT.c.id.in_(ids)).values(timestamp=stamp))
    conn.execute(
        build_queue_statement(conn.dialect, on_conflict="refresh"), {"ids": ids, "created_at": stamp}
    )
    session.commit()
    return ids


def _ours(session: Session, asset_ids: Sequence[int], policy: ConflictPolicy) -> list[int]:
    names = session.execute(sa.select(AssetModel.name, AssetModel.uri).where(AssetModel.id.in_(asset_ids)))
    events = [register_asset_change(asset=_Ref(n, u), session=session, on_conflict=policy) for n, u in names]
    ids = [e.id for e in events if e is not None]
    session.commit()
    return ids


@dataclass(frozen=True)
class _Ref:
    name: str
    uri: str


def _protocol(name: str, *, locks: bool) -> Callable[[Session, Sequence[int]], list[int]]:
    """``stamp_first``, or ours with the plug-in's choice where the scheduler does (not) lock rows."""
    if name == "stamp_first":
        return stamp_first
    # "auto" where the scheduler locks rows: "refresh" (PostgreSQL, MySQL 8; MariaDB stands in).
    policy: ConflictPolicy = "refresh" if locks else "refresh_after_commit"
    return lambda session, asset_ids: _ours(session, asset_ids, policy)


@dataclass
class Outcome:
    protocol: str
    events: int = 0
    lost: int = 0
    twice: int = 0
    runs: int = 0
    #: Deadlocks (the victim's transaction is dropped, not retried: it wrote nothing).
    deadlocks: int = 0
    #: Seconds from each event's stamp to its commit being visible to another connection.
    windows: list[float] = field(default_factory=list)

    def line(self) -> str:
        ms = sorted(w * 1000 for w in self.windows) or [0.0]
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        return (
            f"| {self.protocol} | {self.events} | {self.runs} | {self.deadlocks} | {self.lost} "
            f"| {self.twice} | {statistics.median(ms):.1f} / {p99:.1f} |"
        )


def _seed(engine: sa.Engine, producers: int) -> list[int]:
    now = utcnow()
    with Session(engine) as s:
        s.add(DagBundleModel(name="residual"))
        s.add(DagModel(dag_id="consumer", bundle_name="residual", is_paused=False))
        assets = [AssetModel(name=f"r{i}", uri=f"s3://r{i}", group="", extra={}) for i in range(producers)]
        s.add_all(assets)
        s.flush()
        for asset in assets:
            s.add(AssetActive(name=asset.name, uri=asset.uri))
            s.add(
                DagScheduleAssetReference(
                    asset_id=asset.id, dag_id="consumer", created_at=now, updated_at=now
                )
            )
        s.commit()
        return [a.id for a in assets]


def measure(url: str, protocol: str, *, producers: int, seconds: float, locks: bool) -> Outcome:
    """One side of the comparison on the scratch database ``url`` (migrated here)."""
    migrate.upgrade(url)
    engine = create_engine(url, pool_size=producers + 3)
    asset_ids = _seed(engine, producers)
    out = Outcome(protocol)
    runs: list[Run] = []
    stop = threading.Event()
    lock = threading.Lock()
    clock = _clock(engine)
    write = _protocol(protocol, locks=locks)

    def produce(asset_id: int) -> None:
        while not stop.is_set():
            try:
                with Session(engine) as session:
                    write(session, [asset_id])
            except sa.exc.DBAPIError as exc:
                _count_deadlock(exc, out, lock)
                continue
            seen = clock()
            with lock, Session(engine) as s:
                stamp = s.scalar(
                    sa.select(sa.func.max(_EVENT.c.timestamp)).where(_EVENT.c.asset_id == asset_id)
                )
                if stamp is not None:
                    out.windows.append((seen - stamp).total_seconds())

    def schedule() -> None:
        while not stop.is_set():
            try:
                _one_pass(engine, locks, runs, lock)
            except sa.exc.DBAPIError as exc:
                _count_deadlock(exc, out, lock)

    threads = [threading.Thread(target=produce, args=(a,)) for a in asset_ids]
    threads.append(threading.Thread(target=schedule))
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    while _one_pass(engine, locks, runs, lock):
        pass
    counts = Counter(event_id for _, events in runs for event_id in events)
    with engine.connect() as conn:
        every = list(conn.execute(sa.select(_EVENT.c.id)).scalars())
    out.events, out.runs = len(every), len(runs)
    out.lost = sum(1 for e in every if counts[e] == 0)
    out.twice = sum(1 for e in every if counts[e] > 1)
    engine.dispose()
    return out


def _count_deadlock(exc: sa.exc.DBAPIError, out: Outcome, lock: threading.Lock) -> None:
    found = classify(exc)
    if found is None or found.kind is not RetryableKind.DEADLOCK:
        raise exc
    with lock:
        out.deadlocks += 1


def _one_pass(engine: sa.Engine, locks: bool, runs: list[Run], lock: threading.Lock) -> bool:
    with lock:
        known = list(runs)
    with engine.begin() as conn:
        run = scheduler_pass(conn, "consumer", locks=locks, runs=known)
    if run is not None:
        with lock:
            runs.append(run)
    return run is not None


def _clock(engine: sa.Engine) -> Callable[[], dt.datetime]:
    from airflow_adrq import dialects

    expression = dialects.get(engine).clock

    def now() -> dt.datetime:
        if expression is None:
            return utcnow()
        with engine.connect() as conn:
            value: dt.datetime = conn.execute(sa.select(expression())).scalar_one()
            return value

    return now


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_adrq_bench.residual", description=__doc__)
    parser.add_argument(
        "--db", required=True, help="server URL: scratch databases are created on it, then dropped"
    )
    parser.add_argument("--producers", type=int, default=4, help="producer threads, one asset each")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds each protocol runs")
    parser.add_argument(
        "--no-row-locks", action="store_true", help="a scheduler without row locks (MariaDB's)"
    )
    args = parser.parse_args(argv)
    print("| protocol | events | runs | deadlocks | lost | consumed twice | stamp to visible p50 / p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for protocol in ("stamp_first", "ours"):
        name = f"adrq_residual_{protocol}_{int(time.time())}"
        url = servers.create_database(args.db, name)
        try:
            found = measure(
                url, protocol, producers=args.producers, seconds=args.seconds, locks=not args.no_row_locks
            )
        finally:
            servers.drop_database(args.db, name)
        print(found.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
