"""Sizes, names and the error of ``--accounting``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from airflow_adrq_bench import servers
from airflow_adrq_bench.errors import BenchError

#: The managers compared, in report order (see :data:`.config.MANAGER_CLASSES`).
MANAGERS: Final = ("stock", "plugin")

#: The DAG bundle of the serialized DAGs this mode writes.
BUNDLE: Final = "adrq-accounting-bundle"
#: The producing DAG (the task-instance stand-ins of :mod:`.worker` name it).
PRODUCER_DAG: Final = "adrq_bench_producer"
WARM_ASSET: Final = "adrq_acct_warm"

_BACKENDS = ("sqlite", *servers.BACKENDS)
_START_TIMEOUT = 600.0


@dataclass(frozen=True)
class AccountingSizes:
    """How big an accounting run is (per database: ``len(holds_ms) * 2`` cells)."""

    #: Producer processes per manager.
    producers: int = 6
    #: Transactions (one event each) per producer and cell.
    transactions: int = 40
    #: Consumer DAGs scheduled on each cell's asset.
    consumers: int = 3
    #: Holds before COMMIT compared, in milliseconds.
    holds_ms: tuple[float, ...] = (5.0, 30.0)
    #: A producer starts no new attempt after this many seconds of a cell.
    budget_s: float = 60.0
    #: The consumer's pause between passes while the producers run.
    consumer_pause_ms: float = 1.0

    def __post_init__(self) -> None:
        if min(self.producers, self.transactions, self.consumers) < 1:
            raise ValueError("producers, transactions and consumers must be at least 1")
        if not self.holds_ms or any(h < 0 for h in self.holds_ms):
            raise ValueError("holds_ms must name at least one hold, none negative")
        if self.budget_s <= 0 or self.consumer_pause_ms < 0:
            raise ValueError("budget_s must be > 0 and consumer_pause_ms >= 0")


DEFAULT: Final = AccountingSizes()
QUICK: Final = AccountingSizes(producers=4, transactions=15, budget_s=30.0)

_SIZE_HELP: Final = {
    "producers": "producer processes per manager",
    "transactions": "transactions (one event each) per producer and cell",
    "consumers": "consumer DAGs of each cell's asset",
    "holds_ms": "holds before COMMIT, comma-separated milliseconds",
    "budget_s": "seconds after a cell's start when producers stop starting transactions",
    "consumer_pause_ms": "the consumer's pause between scheduler passes",
}


class AccountingError(BenchError):
    """The accounting run could not run."""
