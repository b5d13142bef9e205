"""Sizes, names and limits of ``airflow-adrq bench --airflow --live``: what its other modules agree on.

How big a run is (:class:`LiveSizes`), how its deployments are laid out (:class:`LiveShape`),
which asset manager class each manager name selects, the DAG, asset and run ids the DAG files,
the driver and the counting SQL share, and how long a deployment may take (:class:`Deadline`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Final

from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.options import Checked, size


class LiveError(BenchError):
    """The live run could not go on (a component exited, an HTTP call failed, the time limit passed ...)."""


class Deadline:
    """The hard time limit of one deployment: every wait checks it."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()
        self.at = self.started + seconds

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the deployment started."""
        return time.monotonic() - self.started

    def check(self, doing: str) -> None:
        """Raise :class:`LiveError` naming what was being waited for, once the limit passed."""
        if self.left() <= 0:
            raise LiveError(f"hard time limit of {self.seconds:.0f} s reached while {doing}")


#: The managers compared, in report order.
MANAGERS: Final = ("stock", "plugin")

#: ``AIRFLOW__CORE__ASSET_MANAGER_CLASS`` per manager. ``stock`` names Airflow's
#: default class explicitly, so that both deployments are configured the same
#: way and differ in that one value only.
MANAGER_CLASSES: Final[dict[str, str]] = {
    "stock": "airflow.assets.manager.AssetManager",
    "plugin": "airflow_adrq.airflow.AdrqAssetManager",
}

#: The warm-up DAG runs the task paths once before the first burst (the task
#: SDK gives a cold api-server only 5 s per call); its asset has no consumers.
WARM_DAG: Final = "adrq_live_warmup"
WARM_ASSET: Final = "adrq_live_warm"


@dataclass(frozen=True)
class LiveSizes(Checked):
    """How big one deployment's run is; every manager and backend gets the same."""

    instances: int = size(16, "mapped instances of each producer DAG's task (N)", ">=1")
    outlets: int = size(
        3, "outlet assets of every producer instance, a0, a1 ... (shared by all producer DAGs)", ">=1"
    )
    consumers: int = size(64, "consumer DAGs (F), each scheduled on a0 | a1 | ...", ">=1")
    bursts: int = size(4, "bursts: every producer DAG triggered once, then waited for", ">=1")
    producer_dags: int = size(
        1, "producer DAGs (several are needed for stock to deadlock on MySQL/MariaDB)", ">=1"
    )
    own_assets: bool = size(
        False,
        "each producer DAG emits assets of its own (p0a0, p0a1 ..., p1a0 ...) instead of the shared "
        "a0, a1 ...; half the consumers are scheduled on any of them (|), half on all of them (&)",
    )
    schedulers: int = size(
        1, "schedulers: 2 runs Airflow's HA mode (PostgreSQL only; MySQL/MariaDB get 1)", ">=1"
    )
    # Airflow marks a task whose success call deadlocked FAILED directly, whatever this says.
    retries: int = size(1, "retries of the producer task", ">=0")
    settle_s: float = size(
        5.0, "seconds without queue rows and new consumer runs that count as drained", ">0"
    )
    drain_timeout_s: float = size(180.0, "longest wait for a drain (the queue left is then reported)", ">0")
    barrier_timeout_s: float = size(
        0.0, "seconds a producer instance waits for the rest of its burst (0: sized to it)", ">=0"
    )
    lead_s: float = size(0.5, "seconds from the last instance's arrival to the common finish", ">=0")
    # 0: all at once; process scheduling alone then spreads them by ~30 ms.
    spread_s: float = size(
        0.3, "each instance finishes a random 0 to this many seconds after the common finish", ">=0"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.schedulers > 2:
            raise ValueError("schedulers must be 1 or 2")

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
class LiveShape(Checked):
    """How every deployment of a run is laid out (besides ``LiveSizes.schedulers``); stock and the
    plug-in get the same, so a run compares the managers in one shape."""

    executor: str = size(
        "local",
        "local: LocalExecutor; celery: CeleryExecutor with --celery-workers `airflow celery worker` "
        "processes, results in the scratch database (needs apache-airflow-providers-celery, celery[redis])",
        choices=tuple(EXECUTORS),
    )
    celery_workers: int = size(2, "Celery workers, each running a share of a burst at once", ">=1")
    broker_url: str | None = size(
        None,
        "the Celery broker (default: the Redis on 127.0.0.1:6379, a database number per deployment; "
        "every deployment has a queue of its own)",
    )
    pgbouncer: bool = size(
        False,
        "every component (api-server, schedulers, dag-processor, Celery workers) reaches PostgreSQL "
        "through a throwaway PgBouncer in transaction pooling mode, one per deployment (Debian package "
        "pgbouncer; PostgreSQL only); airflow db migrate goes directly",
    )
    api_workers: int = size(1, "[api] workers of the api-server", ">=1")
    reparse_s: int = size(
        0,
        "[dag_processor] min_file_process_interval: the DAG processor re-parses (and re-locks the dag "
        "rows of) every DAG file this often, bursts included (0: Airflow's default, 30 s)",
        ">=0",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, not {self.executor!r}")
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
            "reparse_s": self.reparse_s,
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
    return [f"adrq_live_producer_{p}" for p in range(sizes.producer_dags)]


def consumer_dag_ids(sizes: LiveSizes) -> list[str]:
    """The consumer DAGs' ids (zero-padded so they sort as they are numbered)."""
    return [f"adrq_live_consumer_{i:03d}" for i in range(sizes.consumers)]


def producer_assets(sizes: LiveSizes, producer: int) -> list[str]:
    """The outlet assets producer DAG ``producer``'s instances emit: ``a0``, ``a1`` ... (short: an
    operator sees them in the UI of a kept deployment); with ``own_assets``, ``p<producer>a0`` ..."""
    prefix = f"p{producer}" if sizes.own_assets else ""
    return [f"{prefix}a{j}" for j in range(sizes.outlets)]


def asset_names(sizes: LiveSizes) -> list[str]:
    """Every outlet asset of the run, each once (what every consumer is scheduled on)."""
    producers = range(sizes.producer_dags) if sizes.own_assets else range(1)
    return [name for p in producers for name in producer_assets(sizes, p)]


def all_of_consumers(sizes: LiveSizes) -> list[str]:
    """The consumer DAGs scheduled on ``a0 & a1 & ...`` (with ``own_assets``: the second half)."""
    return consumer_dag_ids(sizes)[sizes.consumers // 2 :] if sizes.own_assets else []


def burst_run_id(burst: int) -> str:
    """The run id of every producer DAG's run in burst ``burst`` (0-based)."""
    return f"burst{burst:02d}"
