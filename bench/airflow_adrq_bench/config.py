"""Benchmark sizes, names and the run plan shared by the controller and the workers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Final

from airflow_adrq_bench.options import Checked, count, nonnegative, positive, size
from airflow_adrq_testing.strategies import STRATEGIES as STRATEGIES

#: What :func:`airflow_adrq.register_asset_change` does when not told otherwise
#: (``queue_mode="commit"``), and the plug-in always.
DEFAULT_STRATEGY: Final = "commit_time"
#: What each scenario does: the ``--scenario`` help in :mod:`.cli`.
SCENARIOS: Final = ("single", "multi_outlet", "with_consumer", "lost_events")
#: ``lost_events`` compares ours (commit mode) with Airflow 3.3.2's shape.
LOST_EVENT_STRATEGIES: Final = ("airflow_3_3", "commit_time")
_DEADLOCK = "raised to {} x PostgreSQL's deadlock_timeout when that is more, unless given"


@dataclasses.dataclass(frozen=True)
class Sizes(Checked):
    """How big a run is. Defaults take a few minutes on 2 cores per server."""

    producers: int = count(8, "producer processes in the single, multi_outlet and with_consumer rounds")
    fanout: int = count(32, "unpaused consumer DAGs of every asset the rounds emit")
    outlets: int = count(3, "assets each multi_outlet / with_consumer transaction emits, in random order")
    paused: int = size(2, "paused consumer DAGs of every asset, never to be queued (the rows check says so)")
    transactions: int = count(4, "transactions each producer runs per multi_outlet / with_consumer round")
    # The verdict's speed row compares single-outlet tx/s: a round of a few transactions a producer
    # lasts ~0.1 s, whose noise left the ratio unclear one run in three (notes-benchout.md).
    single_transactions: int = count(
        16, "transactions each producer runs per single round (the verdict's tx/s compares these)"
    )
    hold_ms: float = nonnegative(
        5.0, "milliseconds a producer transaction stays open after queueing, before COMMIT"
    )
    # From an empty queue each (as after the scheduler consumed it): on PostgreSQL only inserts of
    # absent rows can deadlock.
    rounds: int = count(3, "rounds of every (scenario, strategy), each from an empty queue")
    round_timeout_s: float = positive(
        8.0,
        "seconds after a round's start when producers stop starting transactions (and retries); "
        + _DEADLOCK.format(5),
    )
    max_attempts: int = count(50, "attempts per transaction (the first and its retries) before it gives up")
    lock_timeout_s: float = positive(
        5.0,
        "seconds a statement waits for a lock before failing (PostgreSQL lock_timeout, InnoDB "
        "innodb_lock_wait_timeout); " + _DEADLOCK.format(3),
    )
    sweep: tuple[int, ...] = count((1, 16, 256, 1024, 10000), "fan-outs of the single-call sweep")
    sweep_repeats: int = size(
        7, "timed calls per strategy and fan-out in the sweep (median and spread are shown)", minimum=5
    )
    ratio_fanouts: tuple[int, ...] = count((1, 1024), "fan-outs of the raw-SQL ratio rows")
    ratio_calls: int = size(40, "timed calls per side and fan-out in the raw-SQL ratio", minimum=5)
    lost_producers: int = count(6, "producer processes in the lost_events rounds")
    lost_consumers: int = count(3, "consumer DAGs of the lost_events asset")
    lost_events: int = count(
        240, "events (one per transaction) per lost_events round, split over its producers"
    )
    lost_holds_ms: tuple[float, ...] = nonnegative((5.0, 30.0), "holds before COMMIT compared by lost_events")
    lost_timeout_s: float = positive(
        60.0, "seconds after a lost_events round's start when producers stop starting transactions"
    )


DEFAULT: Final = Sizes()
QUICK: Final = Sizes(
    rounds=1,
    producers=4,
    fanout=8,
    outlets=2,
    # 3 left the one-round tx/s ratios' spreads so wide that runs flipped between met and unclear
    # (3-5 unclear rows, 82-89 s); 6: one unclear row a run, 116-125 s (BENCHMARKS.md).
    transactions=6,
    # 6 in single rounds, as in the others, left one verdict row in three unclear; 24: none in 3 runs.
    single_transactions=24,
    # Above PostgreSQL's usual deadlock_timeout (1 s): one deadlock wait must not end the round.
    round_timeout_s=5.0,
    lock_timeout_s=3.0,
    sweep=(1, 16, 256),
    sweep_repeats=5,
    lost_events=48,
)


def clear_of_deadlock_timeout(
    sizes: Sizes, deadlock_timeout_s: float, *, keep: frozenset[str] = frozenset()
) -> tuple[Sizes, list[str]]:
    """``sizes`` with its lock and round timeouts raised to 3 x and 5 x ``deadlock_timeout_s`` (a lock
    timeout below it turns deadlocks into lock timeouts, a round timeout ends the round in the first
    deadlock wait), except those in ``keep`` (given on the command line: a warning); and what changed."""
    changes: dict[str, Any] = {}
    notes: list[str] = []
    for name, factor in (("lock_timeout_s", 3.0), ("round_timeout_s", 5.0)):
        value, floor = float(getattr(sizes, name)), factor * deadlock_timeout_s
        why = f"{floor:g} s ({factor:g} x the server's deadlock_timeout of {deadlock_timeout_s:g} s)"
        option = "--" + name.replace("_", "-")
        if value < floor and name in keep:
            notes.append(f"warning: {option} {value:g} is below {why}: expect deadlock waits to end rounds")
        elif value < floor:
            changes[name] = floor
            notes.append(f"{option} raised from {value:g} to {why}")
    return dataclasses.replace(sizes, **changes), notes


@dataclasses.dataclass(frozen=True)
class Cell:
    """One round of one strategy in one scenario on one database, with its hold before COMMIT and its
    producer parties (the others only pass the round's barriers)."""

    index: int
    db: str
    url: str
    strategy: str
    scenario: str
    round: int
    hold_ms: float
    producers: int

    def transactions(self, sizes: Sizes) -> int:
        """The transactions each producer of a contention round runs (``single`` has its own count)."""
        return sizes.single_transactions if self.scenario == "single" else sizes.transactions

    def planned(self, sizes: Sizes) -> int:
        """The producer transactions this round plans (each is committed, gave up, or not started)."""
        return (
            sizes.lost_events if self.scenario == "lost_events" else self.producers * self.transactions(sizes)
        )

    @property
    def label(self) -> str:
        """How progress and errors name the round."""
        if self.scenario == "lost_events":
            return f"{self.db} lost_events/{self.strategy} (hold {self.hold_ms:g} ms)"
        return f"{self.db} {self.scenario}/{self.strategy} (round {self.round + 1})"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a party's process needs; written by the runner as JSON for the suite's workers."""

    out_dir: str
    sizes: Sizes
    cells: tuple[Cell, ...]
    #: Seconds to wait at a barrier before giving up on the other processes.
    barrier_timeout_s: float = 120.0

    @property
    def parties(self) -> int:
        """The most producers any cell has, plus the coordinator."""
        return max((c.producers for c in self.cells), default=self.sizes.producers) + 1

    @classmethod
    def load(cls, path: Path) -> Plan:
        """The plan the runner wrote (JSON lists back to the sizes' tuples)."""
        raw = json.loads(path.read_text())
        sizes: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in raw.pop("sizes").items()
        }
        return cls(sizes=Sizes(**sizes), cells=tuple(Cell(**c) for c in raw.pop("cells")), **raw)
