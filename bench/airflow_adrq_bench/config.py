"""Benchmark sizes, names and the run plan shared by the controller and the workers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "BASELINE_STRATEGIES",
    "COMMITTED",
    "CONTENTION_SCENARIOS",
    "DEFAULT",
    "DEFAULT_STRATEGY",
    "GAVE_UP",
    "LOST_EVENT_STRATEGIES",
    "NOT_STARTED",
    "QUICK",
    "SCENARIOS",
    "SIZE_HELP",
    "STRATEGIES",
    "Cell",
    "Plan",
    "Sizes",
    "clear_of_deadlock_timeout",
]

#: Strategies in report order: the three loop versions (Airflow 3.3.2's whole
#: ``register_asset_change``, :mod:`airflow_adrq_bench.baselines`), then ours
#: (:func:`airflow_adrq.register_asset_change`, immediate and commit mode).
BASELINE_STRATEGIES: Final = ("airflow_3_3", "sorted_loop", "values_batch")
STRATEGIES: Final = (*BASELINE_STRATEGIES, "per_call", "commit_time")
#: ``outcome`` of a producer transaction record: every planned transaction gets exactly one.
COMMITTED: Final = "committed"
GAVE_UP: Final = "gave up"
NOT_STARTED: Final = "not started"

#: What :func:`airflow_adrq.register_asset_change` does when not told otherwise
#: (``queue_mode="commit"``), and the plug-in always.
DEFAULT_STRATEGY: Final = "commit_time"

#: ``single``: every producer emits the same asset; ``multi_outlet``: every
#: transaction emits ``outlets`` assets in random order; ``with_consumer``:
#: ``multi_outlet`` while a scheduler-like process claims and deletes rows;
#: ``lost_events``: producers of one asset against a consumer applying
#: Airflow 3.3.2's scheduler rule, counting (event, consumer) pairs no run
#: consumed (strategies :data:`LOST_EVENT_STRATEGIES` only).
SCENARIOS: Final = ("single", "multi_outlet", "with_consumer", "lost_events")
CONTENTION_SCENARIOS: Final = ("single", "multi_outlet", "with_consumer")

#: ``lost_events`` compares ours (commit mode) with Airflow 3.3.2's shape.
LOST_EVENT_STRATEGIES: Final = ("airflow_3_3", "commit_time")


@dataclass(frozen=True)
class Sizes:
    """How big a run is. Defaults take a few minutes on 2 cores per server."""

    producers: int = 8
    fanout: int = 32
    outlets: int = 3
    #: Paused consumers of every asset (must never be queued).
    paused: int = 2
    #: Transactions per producer per round.
    transactions: int = 4
    #: Time a transaction stays open after queueing (the rest of task success).
    hold_ms: float = 5.0
    #: Each round starts from an empty queue (as after the scheduler consumed
    #: it): on PostgreSQL only inserts of absent rows can deadlock.
    rounds: int = 3
    #: After this, producers start no new attempt; the round ends.
    round_timeout_s: float = 8.0
    max_attempts: int = 50
    #: PostgreSQL ``lock_timeout`` / InnoDB ``innodb_lock_wait_timeout``.
    lock_timeout_s: float = 5.0
    sweep: tuple[int, ...] = (1, 16, 256, 1024, 10000)
    sweep_repeats: int = 3
    #: Fan-outs of the raw-SQL ratio row, and timed calls per side per fan-out.
    ratio_fanouts: tuple[int, ...] = (1, 1024)
    ratio_calls: int = 40
    #: ``lost_events``: producers of one asset, its consumer DAGs, events in
    #: all (split over the producers), and the holds before COMMIT compared.
    lost_producers: int = 6
    lost_consumers: int = 3
    lost_events: int = 240
    lost_holds_ms: tuple[float, ...] = (5.0, 30.0)
    #: A ``lost_events`` round stops starting transactions after this.
    lost_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "producers",
            "fanout",
            "outlets",
            "transactions",
            "rounds",
            "max_attempts",
            "ratio_calls",
            "lost_producers",
            "lost_consumers",
            "lost_events",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.hold_ms < 0 or self.round_timeout_s <= 0 or self.lock_timeout_s <= 0:
            raise ValueError("hold_ms must be >= 0 and the timeouts > 0")
        if self.lost_timeout_s <= 0 or any(h < 0 for h in self.lost_holds_ms):
            raise ValueError("lost_timeout_s must be > 0 and lost_holds_ms >= 0")
        if any(f < 1 for f in (*self.sweep, *self.ratio_fanouts)):
            raise ValueError("fan-out values must be at least 1")

    @property
    def max_fanout(self) -> int:
        """The most consumer DAGs any asset of the seed data has."""
        return max(self.fanout, *self.sweep, *self.ratio_fanouts)


#: ``--help`` text of every size option (its default and ``--quick`` value are added).
SIZE_HELP: Final[dict[str, str]] = {
    "producers": "producer processes in the single, multi_outlet and with_consumer rounds",
    "fanout": "unpaused consumer DAGs of every asset the rounds emit",
    "outlets": "assets each multi_outlet / with_consumer transaction emits, in random order",
    "paused": "paused consumer DAGs of every asset, never to be queued (the rows check says so)",
    "transactions": "transactions each producer runs per round",
    "hold_ms": "milliseconds a producer transaction stays open after queueing, before COMMIT",
    "rounds": "rounds of every (scenario, strategy), each from an empty queue",
    "round_timeout_s": (
        "seconds after a round's start when producers stop starting transactions (and retries); "
        "raised to 5 x PostgreSQL's deadlock_timeout when that is more, unless given"
    ),
    "max_attempts": "attempts per transaction (the first and its retries) before it gives up",
    "lock_timeout_s": (
        "seconds a statement waits for a lock before failing (PostgreSQL lock_timeout, InnoDB "
        "innodb_lock_wait_timeout); raised to 3 x PostgreSQL's deadlock_timeout when that is more, "
        "unless given"
    ),
    "sweep": "fan-outs of the single-call sweep, comma-separated",
    "sweep_repeats": "timed calls per strategy and fan-out in the sweep; the median is shown",
    "ratio_fanouts": "fan-outs of the raw-SQL ratio rows, comma-separated",
    "ratio_calls": "timed calls per side and fan-out in the raw-SQL ratio",
    "lost_producers": "producer processes in the lost_events rounds",
    "lost_consumers": "consumer DAGs of the lost_events asset",
    "lost_events": "events (one per transaction) per lost_events round, split over its producers",
    "lost_holds_ms": "holds before COMMIT compared by lost_events, comma-separated milliseconds",
    "lost_timeout_s": "seconds after a lost_events round's start when producers stop starting transactions",
}

DEFAULT: Final = Sizes()
QUICK: Final = Sizes(
    rounds=1,
    producers=4,
    fanout=8,
    outlets=2,
    transactions=3,
    # Well above PostgreSQL's usual deadlock_timeout (1 s): one deadlock wait
    # must not end the round (see clear_of_deadlock_timeout).
    round_timeout_s=5.0,
    lock_timeout_s=3.0,
    sweep=(1, 16, 256),
    sweep_repeats=1,
    ratio_calls=15,
    lost_events=48,
)


#: Multiples of the server's ``deadlock_timeout`` the timeouts are kept at or above.
LOCK_TIMEOUT_FACTOR: Final = 3.0
ROUND_TIMEOUT_FACTOR: Final = 5.0


def clear_of_deadlock_timeout(
    sizes: Sizes, deadlock_timeout_s: float, *, keep: frozenset[str] = frozenset()
) -> tuple[Sizes, list[str]]:
    """``sizes`` with its lock and round timeouts safely above ``deadlock_timeout_s``; and what changed.

    PostgreSQL waits ``deadlock_timeout`` (1 s by default) in a lock wait
    before it looks for a deadlock. A lock timeout at or below that turns
    deadlocks into lock timeouts, and a round timeout at or below it ends
    the round during the first deadlock wait, so most of the round's
    transactions would never start. ``lock_timeout_s`` is raised to
    :data:`LOCK_TIMEOUT_FACTOR` x and ``round_timeout_s`` to
    :data:`ROUND_TIMEOUT_FACTOR` x ``deadlock_timeout_s``, except the fields
    named in ``keep`` (given on the command line), which only get a warning.
    MySQL/MariaDB (InnoDB detects deadlocks at once) and SQLite pass 0.
    """
    wanted = {
        "lock_timeout_s": LOCK_TIMEOUT_FACTOR * deadlock_timeout_s,
        "round_timeout_s": ROUND_TIMEOUT_FACTOR * deadlock_timeout_s,
    }
    changes: dict[str, Any] = {}
    notes: list[str] = []
    for name, floor in wanted.items():
        value = float(getattr(sizes, name))
        if value >= floor:
            continue
        option = "--" + name.replace("_", "-")
        if name in keep:
            notes.append(
                f"warning: {option} {value:g} is below {floor:g} s ({floor / deadlock_timeout_s:g} x the "
                f"server's deadlock_timeout of {deadlock_timeout_s:g} s): expect deadlock waits to end rounds"
            )
        else:
            changes[name] = floor
            notes.append(
                f"{option} raised from {value:g} to {floor:g} s ({floor / deadlock_timeout_s:g} x the "
                f"server's deadlock_timeout of {deadlock_timeout_s:g} s)"
            )
    return dataclasses.replace(sizes, **changes), notes


@dataclass(frozen=True)
class Cell:
    """One round of one strategy in one scenario on one database.

    ``hold_ms``: the hold before COMMIT (``lost_events`` cells; the other
    scenarios use :attr:`Sizes.hold_ms`). ``producers``: how many producer
    parties take part (the others only pass the round's barriers).
    """

    index: int
    db: str
    url: str
    strategy: str
    scenario: str
    round: int
    hold_ms: float
    producers: int

    def planned(self, sizes: Sizes) -> int:
        """The producer transactions this round plans (each is committed, gave up, or not started)."""
        if self.scenario == "lost_events":
            return sizes.lost_events
        return self.producers * sizes.transactions

    @property
    def label(self) -> str:
        hold = f" hold {self.hold_ms:g} ms" if self.scenario == "lost_events" else ""
        return f"{self.db} {self.scenario}/{self.strategy}{hold} r{self.round}"


@dataclass(frozen=True)
class Plan:
    """Everything a worker needs; written by the controller as JSON."""

    out_dir: str
    sizes: Sizes
    cells: tuple[Cell, ...]
    #: Seconds to wait at a barrier before giving up on the other processes.
    barrier_timeout_s: float = 120.0

    @property
    def parties(self) -> int:
        """The most producers any cell has, plus the coordinator (which is also the consumer)."""
        return max((c.producers for c in self.cells), default=self.sizes.producers) + 1

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> Plan:
        raw = json.loads(path.read_text())
        sizes = raw["sizes"]
        for name, value in sizes.items():
            if isinstance(value, list):
                sizes[name] = tuple(value)
        return cls(
            out_dir=raw["out_dir"],
            sizes=Sizes(**sizes),
            cells=tuple(Cell(**c) for c in raw["cells"]),
            barrier_timeout_s=raw["barrier_timeout_s"],
        )
