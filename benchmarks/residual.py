"""What is left of the timing race: producers of *disjoint* rows feeding one DAG, a scheduler running.

Run it where the benchmark is installed (``pip install . ./testing ./bench``)::

    python benchmarks/residual.py --db postgresql://root@127.0.0.1/postgres [--seconds 20]

Producers sharing a queue row are stamped in commit order. Producers of different assets feeding one DAG share
no row: one can be stamped, another stamped later and committed, and a scheduler read between them, all before
the first one's COMMIT is visible. How often: ``--producers`` threads, each emitting its own asset in a loop,
one consumer DAG scheduled on all of them, and Airflow 3.3.2's scheduler step
(:func:`airflow_adrq_testing.scheduler.scheduler_pass`) in a loop, with ``FOR UPDATE SKIP LOCKED`` or without
row locks (``--no-row-locks``: MariaDB's); then the queue is drained and every event's runs counted. Side by
side, each on its own scratch database: airflow-adrq's protocol and the ones before it
(:mod:`airflow_adrq_testing.protocols`). Also the window (stamp to commit visible to another connection) and
the time from an event's COMMIT to the run that consumes it.

Not part of any distribution: a maintainer's tool for the design question GUARANTEES.md ("Timing") and
BENCHMARKS.md's residual section answer (what the present protocol costs against the one before it).
``airflow-adrq bench --airflow --accounting --fan-in`` measures the same race, stock against the plug-in,
through Airflow's own scheduler.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, dialects, migrate, queue_events
from airflow_adrq.dialects import ConflictPolicy
from airflow_adrq.models import utcnow
from airflow_adrq.retry import RetryableKind, classify
from airflow_adrq_bench import options
from airflow_adrq_bench.options import Checked, size
from airflow_adrq_bench.stats import median, percentile
from airflow_adrq_testing import dataset
from airflow_adrq_testing.protocols import events, landed, stamp_first
from airflow_adrq_testing.scheduler import EVENT, Run, scheduler_pass


class _Event(NamedTuple):
    id: int
    asset_id: int


def _protocol(name: str, *, locks: bool) -> Callable[[Session, Sequence[int]], list[int]]:
    """``stamp_first``, ``landed``, or ours with the plug-in's choice for a scheduler with(out) row locks."""
    # "auto" where the scheduler locks rows: "refresh" (PostgreSQL, MySQL 8; MariaDB stands in).
    policy: ConflictPolicy = "refresh" if locks else "refresh_after_commit"

    def ours(session: Session, asset_ids: Sequence[int]) -> list[int]:
        # The installed airflow-adrq's queue write after the events the other protocols write too, so
        # that the sides differ only in the queue write.
        ids = events(session.connection(), asset_ids)
        queue_events(session, [_Event(i, a) for i, a in zip(ids, asset_ids, strict=True)], on_conflict=policy)
        session.commit()
        return ids

    return {"stamp_first": stamp_first, "landed": landed, "ours": ours}[name]


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
    #: Seconds from each consumed event's COMMIT to the COMMIT of the run that consumed it.
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    HEADER = (
        "| protocol | events | ev/s | runs | deadlocks | lost | twice | stamp→seen ms | COMMIT→run ms |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )

    def line(self) -> str:
        ms = [w * 1000 for w in self.windows] or [0.0]
        run = [w * 1000 for w in self.latencies] or [0.0]
        rate = self.events / self.seconds if self.seconds else 0.0
        return (
            f"| {self.protocol} | {self.events} | {rate:.0f} | {self.runs} | {self.deadlocks} | {self.lost} "
            f"| {self.twice} | {median(ms):.1f} / {percentile(ms, 99):.1f} "
            f"| {median(run):.0f} / {percentile(run, 99):.0f} / {max(run):.0f} |"
        )


def measure(url: str, protocol: str, given: Options) -> Outcome:
    """One side of the comparison on the scratch database ``url`` (migrated here)."""
    producers, locks = given.producers, not given.no_row_locks
    migrate.upgrade(url)
    engine = create_engine(url, pool_size=producers + 3)
    asset_ids = [a.id for a in dataset.seed_fan(engine, "residual", outlets=producers, fanout=1)]
    with engine.connect() as conn:
        (dag,) = dataset.consumer_dags(conn, asset_ids[:1])[asset_ids[0]]
    out = Outcome(protocol, seconds=given.seconds)
    runs: list[Run] = []
    #: event id -> time.monotonic() at its producer's COMMIT; at its run's COMMIT.
    committed_at: dict[int, float] = {}
    consumed_at: dict[int, float] = {}
    stop, lock, clock = threading.Event(), threading.Lock(), dialects.get(engine).clock
    write = _protocol(protocol, locks=locks)

    def deadlocked(exc: sa.exc.DBAPIError) -> None:
        found = classify(exc)
        if found is None or found.kind is not RetryableKind.DEADLOCK:
            raise exc
        with lock:
            out.deadlocks += 1

    def one_pass() -> bool:
        with lock:
            known = list(runs)
        with engine.begin() as conn:
            run = scheduler_pass(conn, dag, locks=locks, runs=known)
        if run is not None:
            now = time.monotonic()
            with lock:
                runs.append(run)
                for event_id in run[1]:
                    consumed_at.setdefault(event_id, now)
        return run is not None

    def produce(asset_id: int) -> None:
        while not stop.is_set():
            try:
                with Session(engine) as session:
                    ids = write(session, [asset_id])
            except sa.exc.DBAPIError as exc:
                deadlocked(exc)
                continue
            done = time.monotonic()
            with lock:
                for event_id in ids:
                    committed_at[event_id] = done
            # What the runtime stamps with: the database's clock (on a connection of its own), else Python's.
            if clock is None:
                seen = utcnow()
            else:
                with engine.connect() as conn:
                    seen = conn.execute(sa.select(clock())).scalar_one()
            with lock, Session(engine) as s:
                latest = sa.select(sa.func.max(EVENT.c.timestamp)).where(EVENT.c.asset_id == asset_id)
                stamp = s.scalar(latest)
                if stamp is not None:
                    out.windows.append((seen - stamp).total_seconds())

    def schedule() -> None:
        while not stop.is_set():
            try:
                one_pass()
            except sa.exc.DBAPIError as exc:
                deadlocked(exc)
            stop.wait(given.scheduler_interval_ms / 1000)  # the rest of a scheduler loop (0: pass after pass)

    with ThreadPoolExecutor(producers + 1) as pool:
        running = [pool.submit(produce, a) for a in asset_ids] + [pool.submit(schedule)]
        time.sleep(given.seconds)
        stop.set()
        stopped = time.monotonic()
    for future in running:
        future.result()  # a thread's error, not a quietly shorter run
    while one_pass():
        pass
    counts = Counter(event_id for _, events in runs for event_id in events)
    with engine.connect() as conn:
        every = list(conn.execute(sa.select(EVENT.c.id)).scalars())
    out.events, out.runs = len(every), len(runs)
    out.lost = sum(1 for e in every if counts[e] == 0)
    out.twice = sum(1 for e in every if counts[e] > 1)
    # Only events consumed while the producers ran: the drain afterwards is not a scheduler loop.
    out.latencies = [
        consumed_at[e] - committed_at[e]
        for e in every
        if e in consumed_at and e in committed_at and committed_at[e] <= consumed_at[e] <= stopped
    ]
    engine.dispose()
    return out


@dataclass(frozen=True)
class Options(Checked):
    """The run's options (``--help``), one per field."""

    producers: int = size(4, "producer threads, one asset each", minimum=1)
    seconds: float = size(20.0, "seconds each protocol runs", above=0)
    no_row_locks: bool = size(False, "a scheduler without row locks (MariaDB's)")
    scheduler_interval_ms: float = size(
        0.0, "pause between scheduler passes, the rest of a scheduler loop (0: pass after pass)", minimum=0
    )
    protocols: str = size(
        "landed,ours",
        "comma-separated, side by side: landed (rows at PENDING, then stamped; no dag lock), "
        "stamp_first (Python's clock before the statement), ours (the installed airflow-adrq)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="python benchmarks/residual.py", description=__doc__
    )
    parser.add_argument(
        "--db", required=True, help="server URL: scratch databases are created on it, then dropped"
    )
    options.add_fields(parser, Options())
    args = parser.parse_args(argv)
    given = options.sizes_from(parser, args, Options())
    if unknown := set(given.protocols.split(",")) - {"landed", "stamp_first", "ours"}:
        parser.error(f"argument --protocols: not landed, stamp_first or ours: {', '.join(sorted(unknown))}")
    print(Outcome.HEADER)
    for protocol in given.protocols.split(","):
        with dataset.scratch_database(args.db) as url:
            found = measure(url, protocol, given)
        print(found.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
