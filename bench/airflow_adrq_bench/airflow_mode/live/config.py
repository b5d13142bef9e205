"""Sizes, names and limits of ``airflow-adrq bench --airflow --live``.

Everything the other modules of the live mode agree on lives here: how big a
run is (:class:`LiveSizes`), how its deployments are laid out
(:class:`LiveShape`: executor, PgBouncer, api-server workers), which asset
manager class each manager name selects, the DAG, asset and run ids the DAG files, the driver and the counting
SQL share, and how long a deployment may take before it is stopped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Final

from airflow_adrq_bench.errors import BenchError

__all__ = [
    "ASSET_PREFIX",
    "CONSUMER_PREFIX",
    "DEFAULT",
    "EXECUTORS",
    "MANAGERS",
    "MANAGER_CLASSES",
    "PRODUCER_PREFIX",
    "SMALL",
    "WARM_ASSET",
    "WARM_DAG",
    "Deadline",
    "LiveError",
    "LiveShape",
    "LiveSizes",
    "TimeLimitError",
    "asset_names",
    "burst_run_id",
    "consumer_dag_ids",
    "default_time_limit",
    "producer_dag_ids",
]


class LiveError(BenchError):
    """The live run could not go on (a component exited, an HTTP call failed ...)."""


class TimeLimitError(LiveError):
    """A deployment ran past its hard time limit."""


class Deadline:
    """The hard time limit of one deployment: every wait checks it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.at = self.started + seconds

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the deployment started."""
        return time.monotonic() - self.started

    def check(self, doing: str) -> None:
        """Raise :class:`TimeLimitError` naming what was being waited for, once the limit passed."""
        if self.left() <= 0:
            raise TimeLimitError(f"hard time limit of {self.seconds:.0f} s reached while {doing}")


#: The managers compared, in report order.
MANAGERS: Final = ("stock", "plugin")

#: ``AIRFLOW__CORE__ASSET_MANAGER_CLASS`` per manager. ``stock`` names Airflow's
#: default class explicitly, so that both deployments are configured the same
#: way and differ in that one value only.
MANAGER_CLASSES: Final[dict[str, str]] = {
    "stock": "airflow.assets.manager.AssetManager",
    "plugin": "airflow_adrq.airflow.AdrqAssetManager",
}

PRODUCER_PREFIX: Final = "adrq_live_producer_"
CONSUMER_PREFIX: Final = "adrq_live_consumer_"
#: The asset names are short on purpose (``a0``, ``a1`` ...): they are what an
#: operator sees in the UI of a kept deployment.
ASSET_PREFIX: Final = "a"
#: The warm-up DAG runs the task paths once before the first burst (the task
#: SDK gives a cold api-server only 5 s per call); its asset has no consumers.
WARM_DAG: Final = "adrq_live_warmup"
WARM_ASSET: Final = "adrq_live_warm"


@dataclass(frozen=True)
class LiveSizes:
    """How big one deployment's run is; every manager and backend gets the same."""

    #: Mapped instances of each producer DAG's one task.
    instances: int = 16
    #: Assets every producer instance emits (shared by all producer DAGs).
    outlets: int = 3
    #: Consumer DAGs, each scheduled on the OR of every outlet asset.
    consumers: int = 64
    #: Bursts: every producer DAG triggered once, then waited for.
    bursts: int = 4
    #: Producer DAGs (several are needed for stock to deadlock on MySQL/MariaDB).
    producer_dags: int = 1
    #: Schedulers (2: Airflow's HA mode; PostgreSQL only).
    schedulers: int = 1
    #: ``retries`` of the producer task (Airflow marks a task whose success call
    #: deadlocked FAILED directly, whatever this says).
    retries: int = 1
    #: Seconds without a queue row and without a new consumer run that count as drained.
    settle_s: float = 5.0
    #: Longest wait for a drain; the queue left behind is then reported, not waited for.
    drain_timeout_s: float = 180.0
    #: Seconds every producer instance of a burst waits for the others before it
    #: goes on alone (normally they all arrive and finish together).
    barrier_timeout_s: float = 0.0
    #: Seconds between the last instance's arrival and the common finish.
    lead_s: float = 0.5
    #: Each instance finishes a random 0..spread_s seconds after the common deadline
    #: (0: all at once; process scheduling alone then spreads them by ~30 ms).
    spread_s: float = 0.3

    def __post_init__(self) -> None:
        if min(self.instances, self.outlets, self.consumers, self.bursts, self.producer_dags) < 1:
            raise ValueError("instances, outlets, consumers, bursts and producer dags must be at least 1")
        if self.schedulers not in (1, 2):
            raise ValueError("schedulers must be 1 or 2")
        if min(self.retries, self.lead_s, self.spread_s) < 0 or min(self.settle_s, self.drain_timeout_s) <= 0:
            raise ValueError("retries, lead and spread must be >= 0; settle and drain timeout > 0")
        if self.barrier_timeout_s < 0:
            raise ValueError("barrier timeout must be >= 0 (0: sized to the burst)")

    @property
    def tasks_per_burst(self) -> int:
        """Producer task instances of one burst (every producer DAG's mapped task)."""
        return self.instances * self.producer_dags

    @property
    def expected_events(self) -> int:
        """Asset events the bursts write when every producer instance succeeds."""
        return self.instances * self.outlets * self.producer_dags * self.bursts

    @property
    def barrier_s(self) -> float:
        """The barrier's timeout: given, or long enough for a burst's task processes to start."""
        if self.barrier_timeout_s:
            return self.barrier_timeout_s
        # About 1.5 s of CPU to start a task process on this kind of machine.
        return 60.0 + 3.0 * self.tasks_per_burst


#: The defaults: 16 instances x 3 outlets x 64 consumers x 4 bursts, 1 producer DAG.
DEFAULT: Final = LiveSizes()
#: The size of the test suite's run (tests/plugin/test_live.py).
SMALL: Final = LiveSizes(instances=4, outlets=2, consumers=8, bursts=2, producer_dags=2, settle_s=4.0)


#: ``AIRFLOW__CORE__EXECUTOR`` per ``--executor``.
EXECUTORS: Final[dict[str, str]] = {"local": "LocalExecutor", "celery": "CeleryExecutor"}


@dataclass(frozen=True)
class LiveShape:
    """How every deployment of a run is laid out (besides ``LiveSizes.schedulers``); stock and the
    plug-in get the same, so a run compares the managers in one shape."""

    #: ``local`` (LocalExecutor) or ``celery`` (CeleryExecutor with its own workers).
    executor: str = "local"
    #: ``airflow celery worker`` processes (``celery`` only).
    celery_workers: int = 2
    #: The Celery broker (``celery`` only); None: the local Redis, a database number per deployment.
    broker_url: str | None = None
    #: A throwaway PgBouncer (transaction pooling) in front of PostgreSQL for every component.
    pgbouncer: bool = False
    #: ``[api] workers``: the api-server's worker processes.
    api_workers: int = 1

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, not {self.executor!r}")
        if min(self.celery_workers, self.api_workers) < 1:
            raise ValueError("celery workers and api workers must be at least 1")
        if self.broker_url is not None and self.executor != "celery":
            raise ValueError("a broker URL needs the celery executor")

    @property
    def celery(self) -> bool:
        """Whether the deployments run CeleryExecutor (and start workers)."""
        return self.executor == "celery"

    def describe(self, schedulers: int) -> dict[str, Any]:
        """What a report names a deployment's shape by (``schedulers``: the deployment's own count)."""
        return {
            "executor": EXECUTORS[self.executor],
            "celery_workers": self.celery_workers if self.celery else 0,
            "pgbouncer": self.pgbouncer,
            "schedulers": schedulers,
            "api_workers": self.api_workers,
        }


def default_time_limit(sizes: LiveSizes) -> float:
    """Seconds one deployment (one manager on one backend) may take, start to stop.

    Sized from what was measured on 2 cores: about 2 minutes to migrate, start
    the components, parse the DAG files and warm up; per burst about 2 s per
    producer task process (start, run, success call), a drain, and twice that
    as headroom; plus the final event's drain.
    """
    per_burst = 30.0 + 4.0 * sizes.tasks_per_burst + sizes.settle_s
    fixed = 300.0 + 2 * (sizes.settle_s + sizes.drain_timeout_s)
    return float(math.ceil(fixed + 2 * sizes.bursts * per_burst))


def producer_dag_ids(sizes: LiveSizes) -> list[str]:
    """The producer DAGs' ids."""
    return [f"{PRODUCER_PREFIX}{p}" for p in range(sizes.producer_dags)]


def consumer_dag_ids(sizes: LiveSizes) -> list[str]:
    """The consumer DAGs' ids (zero-padded so they sort as they are numbered)."""
    return [f"{CONSUMER_PREFIX}{i:03d}" for i in range(sizes.consumers)]


def asset_names(sizes: LiveSizes) -> list[str]:
    """The outlet assets every producer instance emits: ``a0``, ``a1`` ..."""
    return [f"{ASSET_PREFIX}{j}" for j in range(sizes.outlets)]


def burst_run_id(burst: int) -> str:
    """The run id of every producer DAG's run in burst ``burst`` (0-based)."""
    return f"burst{burst:02d}"
