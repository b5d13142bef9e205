"""Which Airflow schema the queue statement writes: the tables differ between release lines.

The statement (:mod:`airflow_adrq.queue`) reads the same reference tables in
every Airflow 3 release; what differs is a few columns and the queue's key:

======================  =========================================  ===============================
release line            differences the statement must follow      :class:`QueueShape`
======================  =========================================  ===============================
3.0, 3.1                no ``dag.timetable_partitioned`` nor       :data:`UNPARTITIONED`
                        ``asset_event.partition_key`` (partitioned
                        assets came in 3.2, migrations 0095/0107)
3.2, 3.3                partitioned DAGs and keyed events are not  :data:`PARTITIONED`
                        put in the queue
3.4                     ``dag.is_draining`` DAGs are not queued    :data:`EVENT_KEYED`
                        (migration 0134); the queue is keyed by
                        ``(target_dag_id, asset_event_id)``: one
                        row per (consumer, event) (PR #70972)
======================  =========================================  ===============================

:func:`detect` reads the shape off a database's catalog (once per engine), so
the Airflow plug-in writes whatever schema the metadata database has. The
library's own tables (:mod:`airflow_adrq.models`, migration 0001) are the
3.3 shape, :data:`PARTITIONED`.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, false, inspect
from sqlalchemy.engine import Connection, Engine

from airflow_adrq.errors import UnsupportedSchemaError

__all__ = ["EVENT_KEYED", "PARTITIONED", "UNPARTITIONED", "QueueShape", "clear_cache", "detect"]


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

    @property
    def dag_columns(self) -> tuple[str, ...]:
        """The ``dag`` columns :meth:`consumer_filter` reads."""
        return (
            "is_paused",
            *(["is_draining"] if self.draining else []),
            *(["timetable_partitioned"] if self.partitions else []),
        )

    def consumer_filter(self, dag: Any, *, partitioned: bool = False) -> list[ColumnElement[bool]]:
        """The conditions on ``dag``'s columns (``table.c``) of a consumer Airflow queues.

        Unpaused (and, where the column exists, not draining), as Airflow's
        ``register_asset_change`` filters them; of those, only the
        non-partitioned ones get an ``asset_dag_run_queue`` row (the
        partitioned ones go to Airflow's ``asset_partition_dag_run``), so
        ``partitioned=True`` keeps them in, for callers that route them
        themselves. The one definition the statement, the Airflow plug-in
        and ``doctor`` use.
        """
        conditions = [dag.is_paused == false()]
        if self.draining:
            conditions.append(dag.is_draining == false())
        if self.partitions and not partitioned:
            conditions.append(dag.timetable_partitioned == false())
        return conditions


#: Airflow 3.0 and 3.1: no partitioned assets.
UNPARTITIONED = QueueShape("unpartitioned", partitions=False)
#: Airflow 3.2 and 3.3, and this library's own tables.
PARTITIONED = QueueShape("partitioned", partitions=True)
#: Airflow 3.4: draining DAGs, one queue row per (consumer, event).
EVENT_KEYED = QueueShape("event-keyed", partitions=True, draining=True, event_keyed=True)

_KNOWN = (UNPARTITIONED, PARTITIONED, EVENT_KEYED)
_cache: weakref.WeakKeyDictionary[Engine, dict[str | None, QueueShape]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def detect(connection: Connection, schema: str | None = None) -> QueueShape:
    """The :class:`QueueShape` of the database behind ``connection``; cached per engine and schema.

    Reads the catalog (columns of ``dag`` and ``asset_event``, the primary
    key of ``asset_dag_run_queue``, in ``schema`` if given) through the
    connection, inside the caller's transaction; takes no row locks. Raises
    :class:`~airflow_adrq.errors.UnsupportedSchemaError` for a queue keyed in
    any other way, or a combination no Airflow release has.
    """
    engine = connection.engine
    with _lock:
        cached = _cache.get(engine, {}).get(schema)
    if cached is not None:
        return cached
    inspector = inspect(connection)

    def columns(name: str) -> set[str]:
        if not inspector.has_table(name, schema=schema):
            return set()
        return {c["name"] for c in inspector.get_columns(name, schema=schema)}

    if not inspector.has_table("asset_dag_run_queue", schema=schema):
        raise UnsupportedSchemaError("no asset_dag_run_queue table: not an Airflow 3 metadata database")
    pk = tuple(
        inspector.get_pk_constraint("asset_dag_run_queue", schema=schema).get("constrained_columns") or ()
    )
    dag_columns, event_columns = columns("dag"), columns("asset_event")
    found = QueueShape(
        "detected",
        partitions="timetable_partitioned" in dag_columns and "partition_key" in event_columns,
        draining="is_draining" in dag_columns,
        event_keyed=set(pk) == {"target_dag_id", "asset_event_id"} and len(pk) == 2,
    )
    matches = [
        s
        for s in _KNOWN
        if (s.partitions, s.draining, s.event_keyed) == (found.partitions, found.draining, found.event_keyed)
    ]
    if set(pk) != set(found.queue_key) or "is_paused" not in dag_columns or not matches:
        key = f"({', '.join(pk)})" if pk else "no primary key"
        relevant = sorted(dag_columns & {"is_paused", "timetable_partitioned", "is_draining"})
        raise UnsupportedSchemaError(
            f"asset_dag_run_queue has primary key {key}; dag has columns {', '.join(relevant) or 'none'} "
            "of is_paused, timetable_partitioned, is_draining: not an Airflow 3.0-3.4 schema airflow-adrq "
            "knows how to write."
        )
    with _lock:
        _cache.setdefault(engine, {})[schema] = matches[0]
    return matches[0]


def clear_cache() -> None:
    """Forget the detected shapes (tests; after migrating a database in place)."""
    with _lock:
        _cache.clear()
