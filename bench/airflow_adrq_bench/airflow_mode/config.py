"""Sizes, names and targets of the Airflow mode (``airflow-adrq bench --airflow``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from airflow_adrq_bench.options import Checked, size

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
class Sizes(Checked):
    """How big a run is. The defaults take a few minutes per database on 2 cores."""

    fanouts: tuple[int, ...] = size(
        (1, 64, 1024), "fan-outs (consumer DAGs of the asset) of the one-caller sweep", ">=1"
    )
    sweep_calls: int = size(21, "measured calls per manager and fan-out (after one warm-up call) ...", ">=1")
    sweep_budget_s: float = size(45.0, "... unless this many seconds went by at one fan-out", ">0")
    sweep_min_calls: int = size(5, "... and every manager has at least this many calls", ">=1")
    producers: int = size(8, "producer processes per manager in the contention runs", ">=1")
    fanout: int = size(64, "consumer DAGs of every asset in the contention runs", ">=1")
    outlets: int = size(3, "assets per transaction in multi_outlet", ">=1")
    hold_ms: float = size(
        5.0, "milliseconds a transaction stays open after registering (the rest of task success)", ">=0"
    )
    transactions: int = size(
        10, "transactions per producer per round; every round starts from an empty queue", ">=1"
    )
    rounds: int = size(3, "rounds of every (scenario, manager)", ">=1")
    round_budget_s: float = size(
        20.0,
        "seconds of a round after which a producer starts no new attempt; a manager whose round ran out "
        "of time runs no further rounds of that scenario",
        ">0",
    )


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
