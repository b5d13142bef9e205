"""Sizes, names and targets of the Airflow mode (``airflow-adrq bench --airflow``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT",
    "MANAGERS",
    "MANAGER_CLASSES",
    "QUICK",
    "SCENARIOS",
    "TARGETS",
    "Sizes",
]

#: The three asset managers, in report order.
#:
#: ``stock``: Airflow's own ``airflow.assets.manager.AssetManager`` (no
#: ``[core] asset_manager_class``). ``sorted_loop``: the same with the DAGs of
#: each event sorted by ``dag_id`` before its queue rows are written (apache/
#: airflow PR #70128's idea applied to 3.3.2; see :mod:`.sorted_loop`).
#: ``plugin``: airflow-adrq's ``AdrqAssetManager``. Each runs in processes of
#: its own whose ``[core] asset_manager_class`` selects it, as an operator
#: would configure it.
MANAGERS: Final = ("stock", "sorted_loop", "plugin")

#: ``AIRFLOW__CORE__ASSET_MANAGER_CLASS`` per manager (None: unset, Airflow's default).
MANAGER_CLASSES: Final[dict[str, str | None]] = {
    "stock": None,
    "sorted_loop": "airflow_adrq_bench.airflow_mode.sorted_loop.SortedLoopAssetManager",
    "plugin": "airflow_adrq.airflow.AdrqAssetManager",
}

#: ``single``: every transaction emits the same asset (one outlet);
#: ``multi_outlet``: every transaction emits ``outlets`` assets, through
#: ``TaskInstance.register_asset_changes_in_db`` (which iterates them in the
#: process's own ``set`` order).
SCENARIOS: Final = ("single", "multi_outlet")


@dataclass(frozen=True)
class Sizes:
    """How big a run is. The defaults take a few minutes per database on 2 cores."""

    #: Fan-outs (consumer DAGs of the asset) of the single-caller sweep.
    fanouts: tuple[int, ...] = (1, 64, 1024)
    #: Measured calls per manager and fan-out (after one warm-up call) ...
    sweep_calls: int = 21
    #: ... unless this many seconds went by at one fan-out and every manager
    #: has at least ``sweep_min_calls`` calls.
    sweep_budget_s: float = 45.0
    sweep_min_calls: int = 5
    #: Producer processes per manager in the contention runs.
    producers: int = 8
    #: Consumer DAGs of every asset in the contention runs.
    fanout: int = 64
    #: Assets per transaction in ``multi_outlet``.
    outlets: int = 3
    #: Time a transaction stays open after registering (the rest of task success).
    hold_ms: float = 5.0
    #: Transactions per producer per round; every round starts from an empty queue.
    transactions: int = 10
    rounds: int = 3
    #: A producer starts no new attempt after this many seconds of a round;
    #: a manager whose round ran out of time runs no further rounds of that
    #: scenario.
    round_budget_s: float = 20.0


DEFAULT: Final = Sizes()
QUICK: Final = Sizes(
    sweep_calls=5,
    sweep_budget_s=6.0,
    sweep_min_calls=3,
    transactions=4,
    rounds=1,
    round_budget_s=6.0,
)

#: Issue 9's targets (plug-in against stock for one caller: stock p50 over
#: plug-in p50; under contention: plug-in tx/s over sorted_loop tx/s), per
#: database family. Reported, never asserted.
TARGETS: Final[dict[str, dict[str, float]]] = {
    "postgresql": {"F=1": 1.0, "F=64": 2.5, "F=1024": 4.0, "contention": 2.0},
    "mariadb": {"F=1": 1.0, "F=64": 20.0, "F=1024": 100.0, "contention": 15.0},
}
