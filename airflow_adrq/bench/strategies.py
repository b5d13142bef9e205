"""What "queue the consumers of one asset" means for each benchmarked strategy.

Every strategy is called once per emitted asset inside the producer's
transaction, right after that asset's event row is inserted, as
``register_asset_change`` does in Airflow:

* ``airflow_3_3``, ``sorted_loop``, ``values_batch``: :mod:`airflow_adrq.baselines`;
* ``per_call``: :func:`airflow_adrq.queue.queue_dagruns`, one ordered
  set-based statement per call (``queue_mode="immediate"``);
* ``commit_time``: :func:`airflow_adrq.queue.defer_dagruns`; the transaction's
  assets are queued by one ordered statement when it commits (the default).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from sqlalchemy.orm import Session

from airflow_adrq import baselines
from airflow_adrq.bench.config import STRATEGIES
from airflow_adrq.queue import QueueTarget, defer_dagruns, queue_dagruns

__all__ = ["QueueOne", "get"]

QueueOne = Callable[[Session, int, random.Random], None]


def _per_call(session: Session, asset_id: int, rng: random.Random) -> None:
    queue_dagruns(session, [QueueTarget(asset_id)])


def _commit_time(session: Session, asset_id: int, rng: random.Random) -> None:
    defer_dagruns(session, [QueueTarget(asset_id)])


def _baseline(name: str) -> QueueOne:
    impl = baselines.BASELINES[name]

    def queue_one(session: Session, asset_id: int, rng: random.Random) -> None:
        impl(session, asset_id, rng=rng)

    queue_one.__name__ = name
    return queue_one


_STRATEGIES: Final[dict[str, QueueOne]] = {
    **{name: _baseline(name) for name in baselines.BASELINES},
    "per_call": _per_call,
    "commit_time": _commit_time,
}
assert tuple(_STRATEGIES) == STRATEGIES


def get(name: str) -> QueueOne:
    """The strategy called ``name``; :class:`ValueError` lists the known ones."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})") from None
