"""Which Airflow schema the queue statement writes: the tables differ between release lines.

The reference tables are the same in every Airflow 3 release; a few columns and
the queue's key differ (see the shapes below). The plug-in writes its release
line's shape (:mod:`airflow_adrq.airflow.compat`); ``doctor`` reads a database's
off its catalog (:func:`airflow_adrq.doctor.compatibility.detect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, false

__all__ = ["EVENT_KEYED", "KNOWN", "PARTITIONED", "UNPARTITIONED", "QueueShape"]


@dataclass(frozen=True)
class QueueShape:
    """What the statement may reference, and how the queue is keyed."""

    name: str
    #: ``dag.timetable_partitioned`` and ``asset_event.partition_key`` exist.
    partitions: bool
    #: ``dag.is_draining`` exists (draining DAGs are not queued).
    draining: bool = False
    #: The queue is keyed ``(target_dag_id, asset_event_id)``, one row per event.
    event_keyed: bool = False

    @property
    def queue_key(self) -> tuple[str, str]:
        return ("target_dag_id", "asset_event_id") if self.event_keyed else ("asset_id", "target_dag_id")

    def consumer_filter(self, dag: Any, *, include_partitioned: bool = False) -> list[ColumnElement[bool]]:
        """The conditions on ``dag``'s columns (``table.c``) of a consumer Airflow queues.

        Unpaused (and, where the column exists, not draining), as Airflow's
        ``register_asset_change`` filters them; only the non-partitioned ones get
        a queue row (the others go to ``asset_partition_dag_run``):
        ``include_partitioned=True`` keeps them in, for callers that route them themselves.
        The one definition the statement, the plug-in and ``doctor`` use.
        """
        conditions = [dag.is_paused == false()]
        if self.draining:
            conditions.append(dag.is_draining == false())
        if self.partitions and not include_partitioned:
            conditions.append(dag.timetable_partitioned == false())
        return conditions


#: Airflow 3.0 and 3.1: no ``dag.timetable_partitioned`` nor ``asset_event.partition_key``.
UNPARTITIONED = QueueShape("unpartitioned", partitions=False)
#: Airflow 3.2 and 3.3, and this library's own tables (:mod:`airflow_adrq.models`): partitioned
#: DAGs and keyed events are not queued.
PARTITIONED = QueueShape("partitioned", partitions=True)
#: Airflow 3.4: ``dag.is_draining`` DAGs are skipped; the queue is keyed ``(target_dag_id,
#: asset_event_id)``, one row per (consumer, event).
EVENT_KEYED = QueueShape("event-keyed", partitions=True, draining=True, event_keyed=True)

#: Every shape, oldest first.
KNOWN = (UNPARTITIONED, PARTITIONED, EVENT_KEYED)
