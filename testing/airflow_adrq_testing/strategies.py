"""What "a producer transaction emits these assets" means for each benchmarked strategy.

Every strategy does the whole ``register_asset_change`` path once per emitted
asset, inside the producer's transaction, as Airflow's task-success path
does (``TaskInstance.register_asset_changes_in_db`` calls it once per
outlet): look the asset up by name and URI, write the ``asset_event`` row,
find the consumers, queue them.

* ``airflow_3_3``, ``sorted_loop``, ``values_batch``: a copy of Airflow
  3.3.2's whole ``register_asset_change``
  (:func:`airflow_adrq_testing.baselines.register_asset_change`), differing only in
  how the queue rows are written;
* ``per_call``: :func:`airflow_adrq.register_asset_change` with
  ``queue_mode="immediate"``: one ordered set-based statement per call;
* ``commit_time``: :func:`airflow_adrq.register_asset_change` (default
  commit mode): the transaction's events are queued by one ordered statement
  just before COMMIT.

Listener callbacks go to a ``callback_sink`` (and are dropped), as on
Airflow's Execution API path.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq.manager import AssetLike
from airflow_adrq_testing import baselines
from airflow_adrq_testing.baselines import applies_to as applies_to


@dataclass(frozen=True)
class BenchTask:
    """The producing task instance the events name as their source."""

    dag_id: str = "bench_producer"
    task_id: str = "produce"
    run_id: str = "bench"
    map_index: int = -1


TASK: Final = BenchTask()

#: ``emit(session, assets, rng)``: register one event per asset, in the given order.
Emit = Callable[[Session, Sequence[AssetLike], random.Random], None]


def _emit(
    register: Callable[..., object],
    session: Session,
    assets: Sequence[AssetLike],
    _rng: random.Random,
    **options: Any,
) -> None:
    """``register`` each asset in order, its listener callbacks to a sink that is dropped."""
    sink: list[Callable[[], object]] = []
    for asset in assets:
        register(asset=asset, task_instance=TASK, session=session, callback_sink=sink, **options)


def _baseline(name: baselines.Queueing) -> Emit:
    def emit(session: Session, assets: Sequence[AssetLike], rng: random.Random) -> None:
        _emit(baselines.register_asset_change, session, assets, rng, queueing=name, rng=rng)

    return emit


#: Strategies in report order: the three loop versions, then ours (immediate and commit mode).
STRATEGIES: Final = ("airflow_3_3", "sorted_loop", "values_batch", "per_call", "commit_time")
_STRATEGIES: Final[dict[str, Emit]] = {
    **{name: _baseline(name) for name in baselines.BASELINES},
    "per_call": functools.partial(_emit, airflow_adrq.register_asset_change, queue_mode="immediate"),
    "commit_time": functools.partial(_emit, airflow_adrq.register_asset_change),
}
assert tuple(_STRATEGIES) == STRATEGIES


def get(name: str) -> Emit:
    """The strategy called ``name``; :class:`ValueError` lists the known ones."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None
