"""Sizes and names of the Airflow mode (``airflow-adrq bench --airflow``) and of ``--accounting``.

Also the fields every ``--airflow`` mode's raw results open and close with (:func:`raw_opening`,
:func:`raw_finish`): what ran, when, on how many CPUs and under what load (the three reports print
the load average, so its keys are the same in all of them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from airflow_adrq_bench.options import Checked, size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
    sweep_calls=5,  # every call of a cell: enough for a median and a spread
    sweep_budget_s=6.0,
    sweep_min_calls=5,
    transactions=4,
    rounds=1,
    round_budget_s=6.0,
)

# --- --accounting ---------------------------------------------------------------------

#: The managers ``--accounting`` compares, in report order (see :data:`MANAGER_CLASSES`).
ACCOUNTING_MANAGERS: Final = ("stock", "plugin")


@dataclass(frozen=True)
class AccountingSizes(Checked):
    """How big an accounting run is (per database: ``len(holds_ms) * 2`` cells, twice with ``fan_in``)."""

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
    fan_in: bool = size(
        False,
        "also fan-in cells: each producer emits an asset of its own, one consumer DAG is scheduled on any "
        "of them (the race between producers of different assets, through DagModel.dags_needing_dagruns)",
    )


ACCOUNTING_DEFAULT: Final = AccountingSizes()
ACCOUNTING_QUICK: Final = AccountingSizes(producers=4, transactions=15, budget_s=30.0)


def raw_opening(tool: str, sizes: DataclassInstance, managers: Sequence[str]) -> dict[str, Any]:
    """The first fields of a raw result: the tool, the start time, CPUs, load, sizes, managers."""
    return {
        "tool": tool,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        # Other work on the machine skews every number: the 1/5/15-minute load at start and end.
        "load_average": {"start": list(os.getloadavg())},
        "sizes": dataclasses.asdict(sizes),
        "managers": list(managers),
    }


def raw_finish(raw: dict[str, Any], started: float, *, ndigits: int | None = None) -> None:
    """Add the run's duration since ``started`` (``time.monotonic()``) and the load at its end."""
    elapsed = time.monotonic() - started
    # round(x, None) would be an int: only round when asked to.
    raw["duration_s"] = elapsed if ndigits is None else round(elapsed, ndigits)
    raw["load_average"]["end"] = list(os.getloadavg())
