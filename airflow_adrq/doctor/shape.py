"""A database's queue shape, read off its catalog: what ``doctor`` reports and the tests check.

The plug-in does not read it: it writes its release line's shape
(:mod:`airflow_adrq.shapes`).
"""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from airflow_adrq.errors import UnsupportedSchemaError
from airflow_adrq.shapes import KNOWN, QueueShape

__all__ = ["detect"]


def detect(connection: Connection, schema: str | None = None) -> QueueShape:
    """The :class:`~airflow_adrq.shapes.QueueShape` of the database behind ``connection``.

    Reads the catalog (columns of ``dag`` and ``asset_event``, the primary
    key of ``asset_dag_run_queue``, in ``schema`` if given) through the
    connection, inside the caller's transaction; takes no row locks. Raises
    :class:`~airflow_adrq.errors.UnsupportedSchemaError` for a queue keyed in
    any other way, or a combination no Airflow release has.
    """
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
        for s in KNOWN
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
    return matches[0]
