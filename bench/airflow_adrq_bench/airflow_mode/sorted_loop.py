"""``sorted_loop``: Airflow 3.3.2's ``AssetManager`` with each event's DAGs sorted by ``dag_id``.

apache/airflow PR #70128 (closed unmerged) sorted the DAGs before writing their ``asset_dag_run_queue`` rows,
so that two producers of one asset lock ``(asset, dag_a)`` and ``(asset, dag_b)`` in the same order: here,
3.3.2's two non-partitioned writers, given the DAGs sorted (Python order, as the PR did). It removes the
cycles between producers of one asset, not those between transactions that register several assets (each asset
is still its own statement or loop, in the process's ``set`` order of the outlets). Selected like any asset
manager (``[core] asset_manager_class = airflow_adrq_bench.airflow_mode.sorted_loop.SortedLoopAssetManager``);
it imports Airflow 3.3."""

from __future__ import annotations

from typing import Any

from airflow.assets.manager import AssetManager

__all__ = ["SortedLoopAssetManager"]


def _by_dag_id(dags: Any) -> Any:
    # A list where Airflow types a set: Airflow only iterates it, in this order.
    return sorted(dags, key=lambda dag: dag.dag_id)


# Without Airflow installed (mypy's own env) AssetManager is Any.
class SortedLoopAssetManager(AssetManager):  # type: ignore[misc,unused-ignore]
    """``AssetManager`` whose per-event queue writes visit the DAGs in ``dag_id`` order."""

    @classmethod
    def _queue_dagruns_nonpartitioned_postgres(cls, asset_id: int, dags_to_queue: Any, session: Any) -> None:
        # One multi-row INSERT ... ON CONFLICT DO NOTHING, rows in dag_id order.
        super()._queue_dagruns_nonpartitioned_postgres(asset_id, _by_dag_id(dags_to_queue), session)

    @classmethod
    def _queue_dagruns_nonpartitioned_slow_path(cls, asset_id: int, dags_to_queue: Any, session: Any) -> None:
        # SAVEPOINT + merge per DAG, in dag_id order.
        super()._queue_dagruns_nonpartitioned_slow_path(asset_id, _by_dag_id(dags_to_queue), session)
