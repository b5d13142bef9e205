"""What "a producer transaction emits these assets" means for each benchmarked strategy.

Every strategy does the whole ``register_asset_change`` path once per emitted
asset, inside the producer's transaction, as Airflow's task-success path
does (``TaskInstance.register_asset_changes_in_db`` calls it once per
outlet): look the asset up by name and URI, write the ``asset_event`` row,
find the consumers, queue them.

* ``airflow_3_3``, ``sorted_loop``, ``values_batch``: a copy of Airflow
  3.3.2's whole ``register_asset_change``
  (:func:`airflow_adrq_bench.baselines.register_asset_change`), differing only in
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

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq_bench import baselines
from airflow_adrq_bench.config import STRATEGIES

__all__ = ["TASK", "BenchTask", "Emit", "applies_to", "get"]


class _AssetLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def uri(self) -> str: ...


@dataclass(frozen=True)
class BenchTask:
    """The producing task instance the events name as their source."""

    dag_id: str = "bench_producer"
    task_id: str = "produce"
    run_id: str = "bench"
    map_index: int = -1


TASK: Final = BenchTask()

#: ``emit(session, assets, rng)``: register one event per asset, in the given order.
Emit = Callable[[Session, Sequence[_AssetLike], random.Random], None]


def _baseline(name: baselines.Queueing) -> Emit:
    def emit(session: Session, assets: Sequence[_AssetLike], rng: random.Random) -> None:
        sink: list[Callable[[], object]] = []
        for asset in assets:
            baselines.register_asset_change(
                asset=asset, task_instance=TASK, session=session, callback_sink=sink, queueing=name, rng=rng
            )

    emit.__name__ = name
    return emit


def _per_call(session: Session, assets: Sequence[_AssetLike], rng: random.Random) -> None:
    sink: list[Callable[[], object]] = []
    for asset in assets:
        airflow_adrq.register_asset_change(
            asset=asset, task_instance=TASK, session=session, callback_sink=sink, queue_mode="immediate"
        )


def _commit_time(session: Session, assets: Sequence[_AssetLike], rng: random.Random) -> None:
    sink: list[Callable[[], object]] = []
    for asset in assets:
        airflow_adrq.register_asset_change(
            asset=asset, task_instance=TASK, session=session, callback_sink=sink
        )


_STRATEGIES: Final[dict[str, Emit]] = {
    **{name: _baseline(name) for name in baselines.BASELINES},
    "per_call": _per_call,
    "commit_time": _commit_time,
}
assert tuple(_STRATEGIES) == STRATEGIES


def get(name: str) -> Emit:
    """The strategy called ``name``; :class:`ValueError` lists the known ones."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None


def applies_to(name: str, backend: str) -> bool:
    """Whether strategy ``name`` is its own code path on ``backend`` (a URL backend name).

    ``values_batch`` is PR #69977's MySQL/MariaDB branch only; elsewhere it
    would be ``airflow_3_3`` under another name, so it is not run there.
    """
    return baselines.applies_to(name, backend)
