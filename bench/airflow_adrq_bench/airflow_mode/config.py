"""The sizes and names of every Airflow mode: ``--airflow`` (:class:`Sizes`), ``--accounting``
(:class:`AccountingSizes`) and ``--live`` (:class:`LiveSizes`, with the DAG, asset and run ids its DAG
files, driver and SQL share; :class:`LiveShape`), and the asset manager each name selects."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.options import Checked, count, nonnegative, positive, size


class LiveError(BenchError):
    """The live run could not go on (a component exited, an HTTP call failed, the time limit passed ...)."""


#: ``[core] asset_manager_class`` per manager, in report order; every process of a manager selects
#: it as an operator would (``stock`` names Airflow's default explicitly). ``sorted_loop``: stock
#: with each event's DAGs sorted by ``dag_id`` (see :mod:`.sorted_loop`).
MANAGER_CLASSES: Final = {
    "stock": "airflow.assets.manager.AssetManager",
    "sorted_loop": "airflow_adrq_bench.airflow_mode.sorted_loop.SortedLoopAssetManager",
    "plugin": "airflow_adrq.airflow.AdrqAssetManager",
    "plugin_ignore": "airflow_adrq.airflow.AdrqAssetManager",
}
#: ``[core] asset_manager_kwargs`` of a manager (none: Airflow's default, ``{}``). ``plugin_ignore``, only
#: run by ``--standby``: the plug-in writing with ``ON CONFLICT DO NOTHING``, as stock does, instead of its
#: PostgreSQL default ``refresh`` (``DO UPDATE``: a new version of every queued row at each event).
MANAGER_KWARGS: Final = {"plugin_ignore": '{"on_conflict": "ignore"}'}
#: ``--airflow``'s managers; ``--accounting`` and ``--live`` compare stock with the plug-in.
MANAGERS: Final = ("stock", "sorted_loop", "plugin")
STOCK_AND_PLUGIN: Final = ("stock", "plugin")

#: ``single``: every transaction emits the same asset (one outlet); ``multi_outlet``: every
#: transaction emits ``outlets`` assets, through ``TaskInstance.register_asset_changes_in_db`` (which
#: iterates them in the process's own ``set`` order).
SCENARIOS: Final = ("single", "multi_outlet")


@dataclass(frozen=True)
class Sizes(Checked):
    """How big a run is. The defaults take a few minutes per database on 2 cores."""

    fanouts: tuple[int, ...] = count(
        (1, 64, 1024), "fan-outs (consumer DAGs of the asset) of the one-caller sweep"
    )
    sweep_calls: int = count(21, "measured calls per manager and fan-out (after one warm-up call) ...")
    sweep_budget_s: float = positive(45.0, "... unless this many seconds went by at one fan-out")
    sweep_min_calls: int = count(5, "... and every manager has at least this many calls")
    producers: int = count(8, "producer processes per manager in the contention runs")
    fanout: int = count(64, "consumer DAGs of every asset in the contention runs")
    outlets: int = count(3, "assets per transaction in multi_outlet")
    hold_ms: float = nonnegative(
        5.0, "milliseconds a transaction stays open after registering (the rest of task success)"
    )
    transactions: int = count(
        10, "transactions per producer per round; every round starts from an empty queue"
    )
    rounds: int = count(3, "rounds of every (scenario, manager)")
    round_budget_s: float = positive(
        20.0,
        "seconds of a round after which a producer starts no new attempt; a manager whose round ran out "
        "of time runs no further rounds of that scenario",
    )


DEFAULT: Final = Sizes()
#: ``--quick``: 5 calls per sweep cell, every one made (enough for a median and a spread); one short round.
QUICK: Final = Sizes(
    sweep_calls=5, sweep_budget_s=6.0, sweep_min_calls=5, transactions=4, rounds=1, round_budget_s=6.0
)


@dataclass(frozen=True)
class AccountingSizes(Checked):
    """How big an accounting run is (per database: ``len(holds_ms) * 2`` cells, twice with ``fan_in``)."""

    producers: int = count(6, "producer processes per manager")
    transactions: int = count(40, "transactions (one event each) per producer and cell")
    consumers: int = count(3, "consumer DAGs of each cell's asset")
    holds_ms: tuple[float, ...] = nonnegative((5.0, 30.0), "holds before COMMIT in ms, comma-separated")
    budget_s: float = positive(60.0, "seconds into a cell after which producers start no transactions")
    consumer_pause_ms: float = nonnegative(1.0, "the consumer's pause between scheduler passes")
    fan_in: bool = size(
        False,
        "also fan-in cells: each producer emits an asset of its own, --fan-in-consumers DAGs are scheduled "
        "on any of them (producers of different assets racing through DagModel.dags_needing_dagruns)",
    )
    fan_in_consumers: int = count(1, "consumer DAGs of the fan-in cells, each on any producer's asset")
    schedulers: int = count(1, "consumer processes, each a scheduler (a Job of its own) on the same DAGs")
    dag_writers: bool = size(
        False,
        "beside them, Airflow's other writers of the cell's dag rows, each in a process of its own, back to "
        "back: the DAG processor's sync of the cell's DAGs, PATCH /dags/{id} pausing and unpausing 2 extra "
        "consumer DAGs (left out of the accounting), and the bulk PATCH /dags statement unpausing them all",
    )


ACCOUNTING_DEFAULT: Final = AccountingSizes()
ACCOUNTING_QUICK: Final = AccountingSizes(producers=4, transactions=15, budget_s=30.0)


# --- --standby ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StandbySizes(Checked):
    """How big a ``--standby`` run is: phases of one manager's producers at one rate, the managers in
    turn, a transaction open on the primary throughout, readers on the standby."""

    producers: int = count(4, "producer processes per manager")
    fanout: int = count(64, "consumer DAGs of every producer's asset (the same DAGs for all)")
    shared_asset: bool = size(
        False,
        "every producer emits one asset (their queue rows collide: stock deadlocks, the plug-in's "
        "refresh queues) instead of one asset each",
    )
    rate: float = positive(16.0, "transactions per second of a phase, all producers together")
    phase_s: float = positive(90.0, "seconds of a phase")
    rounds: int = count(
        3, "rounds, each a phase per manager, the first rotating (3: each manager in every place once)"
    )
    hold_ms: float = nonnegative(5.0, "ms a transaction stays open after registering, before COMMIT")
    readers: int = count(3, "reader sessions on the standby, each running scheduler passes in a loop")
    reader_pause_ms: float = nonnegative(20.0, "ms a reader pauses between its passes")
    sample_ms: float = positive(25.0, "ms between two samples of the standby's wait events")
    consume_every_s: float = positive(
        1.0, "on the primary, the queue rows are deleted this often (the scheduler's DELETE after a run)"
    )
    background_xids: float = nonnegative(
        200.0,
        "XIDs per second other writers take on the primary, every phase alike (the rest of Airflow); "
        "they spread the producers' XIDs over more pg_subtrans pages",
    )
    dag_lock_hold_ms: float = nonnegative(
        0.0,
        "on the primary, a writer locks every consumer's dag row (FOR NO KEY UPDATE, as the DAG "
        "processor's find_orm_dags) for this many ms, then leaves them free as long, over and over: the "
        "plug-in's NOWAIT then fails and it rolls back to its SAVEPOINT (0: no such writer)",
    )
    overflow_control: bool = size(
        False,
        "then, for contrast, one transaction with 65 subtransactions (the standby's snapshots become "
        "suboverflowed while the open transaction lasts) and one more phase per manager",
    )


STANDBY_DEFAULT: Final = StandbySizes()
#: ``--quick``: one short round.
STANDBY_QUICK: Final = StandbySizes(producers=2, rate=10.0, phase_s=10.0, rounds=1, readers=2)


# --- --live ------------------------------------------------------------------------------

#: ``AIRFLOW__CORE__EXECUTOR`` per ``--executor``.
EXECUTORS: Final = {"local": "LocalExecutor", "celery": "CeleryExecutor"}
#: The warm-up DAG runs the task paths once before the first burst (the task SDK gives a cold
#: api-server only 5 s per call); its asset has no consumers.
WARM_DAG: Final = "adrq_live_warmup"


@dataclass(frozen=True)
class LiveSizes(Checked):
    """How big one deployment's run is; every manager and backend gets the same."""

    instances: int = count(16, "mapped instances of each producer DAG's task (N)")
    outlets: int = count(3, "outlet assets of every producer instance, a0, a1 ... (shared by all)")
    consumers: int = count(64, "consumer DAGs (F), each scheduled on a0 | a1 | ...")
    bursts: int = count(4, "bursts: every producer DAG triggered once, then waited for")
    producer_dags: int = count(1, "producer DAGs (stock deadlocks on MySQL/MariaDB with several)")
    own_assets: bool = size(
        False,
        "each producer DAG emits assets of its own (p0a0 ..., p1a0 ...) instead of the shared a0, a1 ...; "
        "half the consumers are scheduled on any of them (|), half on all of them (&)",
    )
    schedulers: int = count(1, "schedulers: 2 runs Airflow's HA mode (PostgreSQL only)")
    # Airflow marks a task whose success call deadlocked FAILED directly, whatever this says.
    retries: int = nonnegative(1, "retries of the producer task")
    settle_s: float = positive(5.0, "seconds without queue rows or new consumer runs that count as drained")
    drain_timeout_s: float = positive(180.0, "longest wait for a drain (the queue left is then reported)")
    barrier_timeout_s: float = nonnegative(0.0, "seconds an instance waits for its whole burst (0: sized)")
    lead_s: float = nonnegative(0.5, "seconds from the last instance's arrival to the common finish")
    # 0: all at once; process scheduling alone then spreads them by ~30 ms.
    spread_s: float = nonnegative(0.3, "instances finish a random 0 to this many s after the common finish")

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
        """The barrier's timeout: given, or enough for a burst's tasks to start (~1.5 s CPU each, 2 cores)."""
        return self.barrier_timeout_s or 60.0 + 3.0 * self.tasks_per_burst

    @property
    def producer_ids(self) -> list[str]:
        """The producer DAGs' ids."""
        return [f"adrq_live_producer_{p}" for p in range(self.producer_dags)]

    @property
    def consumer_ids(self) -> list[str]:
        """The consumer DAGs' ids (zero-padded so they sort as they are numbered)."""
        return [f"adrq_live_consumer_{i:03d}" for i in range(self.consumers)]

    @property
    def all_of_ids(self) -> list[str]:
        """The consumer DAGs scheduled on ``a0 & a1 & ...`` (with ``own_assets``: the second half)."""
        return self.consumer_ids[self.consumers // 2 :] if self.own_assets else []

    def outlets_of(self, producer: int) -> list[str]:
        """Producer DAG ``producer``'s assets: ``a0``, ``a1`` ... (short, for the UI of a kept deployment);
        with ``own_assets``, ``p<producer>a0`` ..."""
        return [f"{f'p{producer}' if self.own_assets else ''}a{j}" for j in range(self.outlets)]

    @property
    def assets(self) -> list[str]:
        """Every outlet asset of the run, each once (what every consumer is scheduled on)."""
        return [a for p in range(self.producer_dags if self.own_assets else 1) for a in self.outlets_of(p)]

    @property
    def run_ids(self) -> list[str]:
        """The run id of every producer DAG's run in each burst."""
        return [f"burst{b:02d}" for b in range(self.bursts)]


#: The defaults: 16 instances x 3 outlets x 64 consumers x 4 bursts, 1 producer DAG.
LIVE_DEFAULT: Final = LiveSizes()
#: ``--small``: the size of the benchmark's own live test.
LIVE_SMALL: Final = LiveSizes(instances=4, outlets=2, consumers=8, bursts=2, producer_dags=2, settle_s=4.0)


@dataclass(frozen=True)
class LiveShape(Checked):
    """How every deployment of a run is laid out (but ``LiveSizes.schedulers``), for every manager alike."""

    executor: str = size(
        "local",
        "local: LocalExecutor; celery: CeleryExecutor with --celery-workers `airflow celery worker` "
        "processes, results in the scratch database (needs apache-airflow-providers-celery, celery[redis])",
        choices=tuple(EXECUTORS),
    )
    celery_workers: int = count(2, "Celery workers, each running a share of a burst at once")
    broker_url: str | None = size(
        None,
        "the Celery broker (default: the Redis on 127.0.0.1:6379, a database number per deployment; "
        "every deployment has a queue of its own)",
    )
    pgbouncer: bool = size(
        False,
        "every component (not airflow db migrate) reaches PostgreSQL through a throwaway PgBouncer in "
        "transaction pooling mode, one per deployment (Debian package pgbouncer; PostgreSQL only)",
    )
    api_workers: int = count(1, "[api] workers of the api-server")
    reparse_s: int = nonnegative(
        0,
        "[dag_processor] min_file_process_interval: the DAG processor re-parses (and re-locks the dag rows "
        "of) every DAG file this often, bursts included (0: Airflow's default, 30 s)",
    )
    pause_churn: bool = size(
        False,
        "while the bursts run, REST pause churn on the consumers: PATCH /api/v2/dags/{id} pausing and "
        "unpausing the last consumer of every 8 (left out of the accounting), and the bulk PATCH "
        "/api/v2/dags is_paused=false over the unpaused consumers (locks their dag rows, changes nothing)",
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


def default_time_limit(sizes: LiveSizes) -> float:
    """Seconds one deployment may take, start to stop, as measured on 2 cores: about 2 minutes to migrate,
    start, parse and warm up; per burst about 2 s per producer task and a drain, twice as headroom."""
    per_burst = 30.0 + 4.0 * sizes.tasks_per_burst + sizes.settle_s
    fixed = 300.0 + 2 * (sizes.settle_s + sizes.drain_timeout_s)
    return float(math.ceil(fixed + 2 * sizes.bursts * per_burst))
