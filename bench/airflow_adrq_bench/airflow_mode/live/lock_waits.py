"""PostgreSQL: who waited for whom during the bursts, sampled from a control connection.

Every :data:`PERIOD_S` a sampler reads ``pg_stat_activity`` of the scratch database (every backend in a
transaction) with ``pg_blocking_pids`` of each one waiting for a lock. A wait (a backend's statement,
by its ``query_start``) lasts from ``query_start`` to the last sample that saw it waiting; the
transactions it waited for (its blockers, and theirs in the same sample: a waiter queued ahead of it
holds the row's tuple lock) last from their ``xact_start`` to the last sample that saw them open.
A producer's wait for a consumer's ``dag`` row is the plug-in's ``SELECT ... FOR SHARE OF dag``
(:mod:`airflow_adrq.dialects.postgresql`); stock's producers take no such lock, their waits count as
``other``.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq_bench.stats import percentile

#: Seconds between two samples (the resolution; each sample itself takes a few ms more).
PERIOD_S: Final = 0.05

#: Every backend of the scratch database in a transaction, but the sampler's own: (sampled at, pid,
#: xact_start, query_start, waiting for a lock, the pids it waits for, its statement).
SAMPLE: Final = sa.text(
    "SELECT clock_timestamp(), pid, xact_start, query_start, wait_event_type = 'Lock', "
    "CASE WHEN wait_event_type = 'Lock' THEN pg_blocking_pids(pid) END, left(query, 300) "
    "FROM pg_stat_activity "
    "WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
)

#: The plug-in's wait for one consumer's ``dag`` row (its NOWAIT / SKIP LOCKED forms never wait).
PRODUCER_WAIT: Final = re.compile(r"FOR SHARE OF dag(?!.*(NOWAIT|SKIP LOCKED))", re.IGNORECASE | re.DOTALL)

#: A transaction: (pid, xact_start).
Xact = tuple[int, dt.datetime]

#: Who a transaction is, by the statements the samples saw it run (the first kind that matches any of
#: them, in this order): Airflow 3.3.2's writers of ``dag`` rows and the producers' task-success calls.
KINDS: Final = (
    ("pause churn", re.compile(r"SET is_paused")),
    ("DAG processor", re.compile(r"FOR NO KEY UPDATE|\bdag_tag\b|\bdag_code\b|\bimport_error\b")),
    ("scheduler", re.compile(r"DELETE FROM asset_dag_run_queue|INSERT INTO dag_run\b|FOR UPDATE OF dag\b")),
    ("producer", re.compile(r"FOR SHARE OF dag|INSERT INTO asset_event\b|UPDATE task_instance SET state")),
)


def kind_of(queries: Iterable[str]) -> str:
    """The first of :data:`KINDS` that any of ``queries`` matches, else ``other``."""
    seen = list(queries)
    return next((kind for kind, pattern in KINDS if any(pattern.search(q) for q in seen)), "other")


@dataclass
class Seen:
    """A transaction as the samples saw it: when last, its statement then, and every statement seen."""

    last_seen: dt.datetime
    query: str
    queries: set[str] = field(default_factory=set)


@dataclass
class Wait:
    """One statement seen waiting for a lock: its text, its transaction's start, when it was last seen
    waiting, and every transaction it waited for (directly or through a waiter ahead of it)."""

    query: str
    xact_start: dt.datetime
    last_seen: dt.datetime
    blockers: set[Xact] = field(default_factory=set)


@dataclass
class Samples:
    """What the samples saw: the waits by (pid, query_start), the transactions, and when each sample was
    taken (monotonic seconds)."""

    waits: dict[Xact, Wait] = field(default_factory=dict)
    xacts: dict[Xact, Seen] = field(default_factory=dict)
    taken: list[float] = field(default_factory=list)

    def add(self, rows: Iterable[Sequence[Any]], taken: float) -> None:
        """One sample's rows (:data:`SAMPLE`'s columns), taken at monotonic ``taken``."""
        rows = list(rows)
        self.taken.append(taken)
        started = {int(r[1]): r[2] for r in rows}
        blocking = {int(r[1]): [int(p) for p in r[5] or ()] for r in rows if r[4]}
        for at, pid, xact_start, query_start, waiting, _, query in rows:
            seen = self.xacts.setdefault((int(pid), xact_start), Seen(at, str(query)))
            seen.last_seen, seen.query = at, str(query)
            seen.queries.add(str(query)[:200])
            if not waiting or query_start is None:
                continue
            wait = self.waits.setdefault((int(pid), query_start), Wait(str(query), xact_start, at))
            wait.last_seen = at
            wait.blockers |= {(p, started[p]) for p in _closure(int(pid), blocking) if p in started}


def _closure(pid: int, blocking: dict[int, list[int]]) -> set[int]:
    """Every pid ``pid`` waits for in one sample: its blockers, theirs, and so on."""
    found: set[int] = set()
    todo = list(blocking.get(pid, ()))
    while todo:
        other = todo.pop()
        if other not in found and other != pid:
            found.add(other)
            todo.extend(blocking.get(other, ()))
    return found


def _ms(span: dt.timedelta) -> float:
    return round(span.total_seconds() * 1000, 1)


def summarize(samples: Samples) -> dict[str, Any]:
    """The producers' waits for consumer rows against the transactions they waited for (:func:`_judge`),
    the other lock waits (how many, the longest and its statement) and the sampling's resolution."""
    gaps = [b - a for a, b in zip(samples.taken, samples.taken[1:], strict=False)]
    out: dict[str, Any] = {
        "samples": len(samples.taken),
        "interval_ms": {
            "p50": _round(percentile(gaps, 50) * 1000),
            "max": _round(percentile(gaps, 100) * 1000),
        },
        "other_waits": 0,
        "other_wait_max_ms": None,
        "other_longest": None,
    }
    producers = []
    for (pid, query_start), wait in samples.waits.items():
        waited = _ms(wait.last_seen - query_start)
        if PRODUCER_WAIT.search(wait.query):
            producers.append((pid, wait, waited))
        else:
            out["other_waits"] += 1
            if out["other_wait_max_ms"] is None or waited > out["other_wait_max_ms"]:
                out["other_wait_max_ms"], out["other_longest"] = waited, wait.query[:120]
    return {**_judge(samples, producers), **out}


def _judge(samples: Samples, producers: Sequence[tuple[int, Wait, float]]) -> dict[str, Any]:
    """Producer waits ``(pid, wait, ms waited)``: how many, the longest, the longest holder, the worst
    wait minus its own longest holder (with both statements); per kind of longest holder (:func:`kind_of`)
    the waits, the longest and the longest holder; per queue write (a producer transaction) its waits
    summed, the longest such sum and the worst sum minus the longest transaction any of them waited for."""
    out: dict[str, Any] = {
        "producer_waits": len(producers),
        "producer_wait_max_ms": None,
        "holder_max_ms": None,
    }
    out |= {"excess_max_ms": None, "worst": None, "by_holder": {}, "writes": 0}
    out |= {"write_wait_max_ms": None, "write_excess_max_ms": None}
    writes: dict[Xact, list[float]] = {}  # per producer transaction: its waits summed, its longest holder
    for pid, wait, waited in producers:
        held = {b: _ms(samples.xacts[b].last_seen - b[1]) for b in wait.blockers if b in samples.xacts}
        holder = max(held, key=held.__getitem__, default=None)
        longest = held[holder] if holder is not None else 0.0
        out["producer_wait_max_ms"] = max(out["producer_wait_max_ms"] or 0.0, waited)
        out["holder_max_ms"] = max(out["holder_max_ms"] or 0.0, longest)
        if out["excess_max_ms"] is None or waited - longest > out["excess_max_ms"]:
            out["excess_max_ms"] = round(waited - longest, 1)
            statement = samples.xacts[holder].query[:120] if holder is not None else None
            out["worst"] = {
                "wait_ms": waited,
                "holder_ms": longest,
                "waiter": wait.query[:120],
                "holder": statement,
            }
        kind = kind_of(samples.xacts[holder].queries) if holder is not None else "unseen"
        by = out["by_holder"].setdefault(kind, {"waits": 0, "wait_max_ms": 0.0, "holder_max_ms": 0.0})
        by["waits"], by["wait_max_ms"] = by["waits"] + 1, max(by["wait_max_ms"], waited)
        by["holder_max_ms"] = max(by["holder_max_ms"], longest)
        write = writes.setdefault((pid, wait.xact_start), [0.0, 0.0])
        write[0], write[1] = write[0] + waited, max(write[1], longest)
    if writes:
        out["writes"] = len(writes)
        out["write_wait_max_ms"] = round(max(w for w, _ in writes.values()), 1)
        out["write_excess_max_ms"] = round(max(w - h for w, h in writes.values()), 1)
    return out


def _round(value: float) -> float | None:
    return None if value != value else round(value, 1)  # NaN (fewer than two samples): None


class Sampler:
    """Samples ``engine``'s database every :data:`PERIOD_S` in a thread while entered; :attr:`error`
    is the error that stopped it early, if any."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.samples = engine, Samples()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adrq-live-lock-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            # AUTOCOMMIT: each sample its own transaction (pg_stat_activity is a snapshot per transaction).
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                due = time.monotonic()
                while not self._stop.wait(max(0.0, due - time.monotonic())):
                    due = time.monotonic() + PERIOD_S
                    self.samples.add(conn.execute(SAMPLE).all(), time.monotonic())
        except SQLAlchemyError as exc:
            self.error = str(exc).splitlines()[0]

    def summary(self) -> dict[str, Any]:
        """:func:`summarize` of what was sampled, with the error that stopped the sampler (None)."""
        return {**summarize(self.samples), "error": self.error}
