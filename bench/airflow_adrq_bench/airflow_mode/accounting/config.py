"""Sizes, names and the error of ``--accounting``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.options import Checked, size

#: The managers compared, in report order (see :data:`..config.MANAGER_CLASSES`).
MANAGERS: Final = ("stock", "plugin")
#: The DAG bundle of the serialized DAGs this mode writes.
BUNDLE: Final = "adrq-accounting-bundle"
WARM_ASSET: Final = "adrq_acct_warm"


@dataclass(frozen=True)
class AccountingSizes(Checked):
    """How big an accounting run is (per database: ``len(holds_ms) * 2`` cells)."""

    producers: int = size(6, "producer processes per manager", ">=1")
    transactions: int = size(40, "transactions (one event each) per producer and cell", ">=1")
    consumers: int = size(3, "consumer DAGs of each cell's asset", ">=1")
    holds_ms: tuple[float, ...] = size(
        (5.0, 30.0), "holds before COMMIT, comma-separated milliseconds", ">=0"
    )
    budget_s: float = size(
        60.0, "seconds after a cell's start when producers stop starting transactions", ">0"
    )
    consumer_pause_ms: float = size(1.0, "the consumer's pause between scheduler passes", ">=0")


DEFAULT: Final = AccountingSizes()
QUICK: Final = AccountingSizes(producers=4, transactions=15, budget_s=30.0)


class AccountingError(BenchError):
    """The accounting run could not run."""
