"""``AdrqAssetManager``: Airflow's ``AssetManager`` with sorted, commit-time queue writes.

Everything Airflow's ``register_asset_change`` does is kept as it is, because
this class inherits it: the asset lookup, the alias association and
``asset_alias_asset_event`` rows, the ``AssetEvent`` (flushed immediately, as
Airflow does), the direct / alias / name / URI reference lookups and the
paused-DAG filter, listener hooks (inline or through ``callback_sink``), the
``asset.updates`` metric, multi-team filtering, and the whole partitioned-DAG
path (``AssetPartitionDagRun``, ``PartitionedAssetKeyLog``, ``Log`` rows).

Only the last step changes: Airflow 3.3 writes each event's non-partitioned
queue rows immediately (PostgreSQL: one ``ON CONFLICT DO NOTHING`` executemany
per event, in ``set`` order; MySQL/SQLite: ``SAVEPOINT`` + ``merge`` per row).
Here the rows are recorded on the session and written just before COMMIT by
one ``INSERT`` sorted by ``(asset_id, target_dag_id)``
(:mod:`airflow_adrq.airflow.pending`), with the backend's "leave an existing
row alone" clause. The rows are the same ones Airflow would write.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from airflow.assets.manager import AssetManager
from airflow.models.asset import AssetDagRunQueue

from airflow_adrq.airflow import pending, schema

if TYPE_CHECKING:
    from airflow.models.dag import DagModel
    from sqlalchemy.orm import Session

__all__ = ["AdrqAssetManager", "flush_queue"]

log = logging.getLogger(__name__)

# The Airflow 3.3 methods this class replaces. If Airflow renames them (3.4
# did), overriding would silently do nothing: refuse to load instead.
_REPLACED_HOOKS = ("_queue_dagruns_nonpartitioned_postgres", "_queue_dagruns_nonpartitioned_slow_path")

_missing = [name for name in _REPLACED_HOOKS if not hasattr(AssetManager, name)]
if _missing:
    try:
        from airflow import __version__ as _airflow_version
    except ImportError:  # pragma: no cover - Airflow always has it
        _airflow_version = "unknown"
    raise ImportError(
        f"airflow_adrq.airflow supports Airflow 3.3 (asset_dag_run_queue keyed by (asset_id, "
        f"target_dag_id)); Airflow {_airflow_version} has no AssetManager.{', '.join(_missing)}. "
        "Remove [core] asset_manager_class to use Airflow's own AssetManager."
    )


# Without Airflow installed (mypy's own env) AssetManager is Any.
class AdrqAssetManager(AssetManager):  # type: ignore[misc,unused-ignore]
    """Airflow ``AssetManager`` whose non-partitioned queue writes are sorted and made at COMMIT.

    Set ``[core] asset_manager_class = airflow_adrq.airflow.AdrqAssetManager``.

    Locks: nothing extra while registering. Just before the outermost COMMIT
    of the session, the queue rows of every asset event in the transaction
    are inserted in ``(asset_id, target_dag_id)`` order by one statement
    (see :func:`airflow_adrq.airflow.pending.flush_rows` for the locks).

    Does not promise: that queue rows are visible before COMMIT inside the
    producing transaction (call :func:`flush_queue` if you need that), nor
    anything about Airflow's own code before the queue write (the partitioned
    path still locks the ``asset`` row as Airflow does).
    """

    def __init__(self, **kwargs: Any) -> None:
        # Airflow builds one instance per process (resolve_asset_manager); the
        # line lets an operator confirm in any component's log that it is used.
        super().__init__(**kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        log.info(
            "airflow-adrq: %s.%s queues asset-triggered runs at commit, sorted by (asset_id, dag_id)",
            type(self).__module__,
            type(self).__qualname__,
        )

    @classmethod
    def _queue_dagruns_nonpartitioned_postgres(
        cls, asset_id: int, dags_to_queue: Collection[DagModel], session: Session
    ) -> None:
        cls._defer_queue_rows(asset_id, dags_to_queue, session)

    @classmethod
    def _queue_dagruns_nonpartitioned_slow_path(
        cls, asset_id: int, dags_to_queue: Collection[DagModel], session: Session
    ) -> None:
        cls._defer_queue_rows(asset_id, dags_to_queue, session)

    @classmethod
    def _defer_queue_rows(cls, asset_id: int, dags_to_queue: Collection[DagModel], session: Session) -> None:
        table = AssetDagRunQueue.__table__
        # First use per engine: refuse a queue table of another shape (Airflow
        # 3.4) before anything is recorded, inside the caller's transaction.
        schema.check_queue_shape(session, table.name, table.schema)
        dag_ids = sorted(dag.dag_id for dag in dags_to_queue)
        pending.defer_rows(session, table, asset_id, dag_ids)
        cls.logger().debug("consuming dag ids %s (queued at commit)", dag_ids)


def flush_queue(session: Session) -> int:
    """Write the queue rows recorded on ``session`` now, instead of at COMMIT.

    Same statement and locks as the automatic write; returns the number of
    rows sent. Only needed if code in the producing transaction must read
    ``asset_dag_run_queue`` after registering events.
    """
    return pending.flush_rows(session)
