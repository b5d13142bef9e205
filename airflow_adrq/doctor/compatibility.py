"""The compatibility half of the report: Airflow's schema version, the queue's shape, the plug-in's support.

``alembic_version`` places the database in Airflow's migration history
(:mod:`.airflow_revisions`); :func:`detect` reads the queue's shape off the
catalog (the plug-in does not: it writes its release line's);
:mod:`airflow_adrq.airflow.compat` says which release lines the plug-in
supports and which shape each makes.
"""

from __future__ import annotations

import dataclasses
import re

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Inspector

from airflow_adrq import shapes
from airflow_adrq.airflow import compat
from airflow_adrq.doctor.airflow_revisions import KNOWN_UP_TO, REVISIONS, schema_version
from airflow_adrq.doctor.backends import Probe, scalar
from airflow_adrq.doctor.report import Compatibility, DoctorError, SchemaVersion
from airflow_adrq.errors import UnsupportedSchemaError

__all__ = ["detect", "read"]

_PASS_URL = "pass Airflow's [database] sql_alchemy_conn as --url"


def read(
    conn: Connection, probe: Probe, inspector: Inspector, tables: set[str], schema: str | None
) -> tuple[Compatibility, shapes.QueueShape | None, list[str]]:
    """``(compatibility, the queue's shape or None, warnings)``; :class:`DoctorError`: no Airflow database."""
    version = schema_version(_alembic_revision(conn, tables))
    warnings = []
    if version.airflow_version is not None and not version.complete:
        warnings.append(
            f"alembic_version {version.revision} is not the last migration of Airflow "
            f"{version.airflow_version}: was `airflow db migrate` interrupted?"
        )
    queue_key = None
    if "asset_dag_run_queue" in tables:
        queue_key = _primary_key(inspector, schema)
    found: shapes.QueueShape | None = None
    try:
        found = detect(conn, schema=schema)
    except UnsupportedSchemaError as exc:
        supported, why, tested = _support(version, None, str(exc))
    else:
        supported, why, tested = _support(version, found, None)
    warnings.extend(_below_minimum(version))
    compatibility = Compatibility(
        backend=probe.name,
        server=probe.server(conn),
        schema=version,
        queue_key=queue_key,
        shape=found.name if found else None,
        shape_lines=[f"{a}.{b}" for (a, b), made in compat.SHAPES.items() if made == found],
        supported=supported,
        support=why,
        tested=tested,
    )
    if "dag" in tables:
        compatibility.dag_id_collations = probe.collations(conn)
    warnings.extend(probe.compatibility(conn, compatibility))
    return compatibility, found, warnings


def _alembic_revision(conn: Connection, tables: set[str]) -> str:
    """The one revision in ``alembic_version``; :class:`DoctorError` when this is no Airflow database."""
    if "alembic_version" not in tables:
        if "airflow_adrq_version" in tables:
            own = scalar(conn, "SELECT version_num FROM airflow_adrq_version")
            raise DoctorError(
                f"this is airflow-adrq's own database (airflow_adrq_version {own}), not an Airflow "
                f"metadata database: {_PASS_URL}"
            )
        if {"dag", "asset_dag_run_queue"} <= tables:
            raise DoctorError(
                "no alembic_version table: these are airflow-adrq's own tables (or a copy), not a database "
                f"Airflow migrated; {_PASS_URL}"
            )
        raise DoctorError(f"no alembic_version table: not an Airflow metadata database; {_PASS_URL}")
    revisions = [str(r) for r in conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()]
    if len(revisions) != 1:
        raise DoctorError(
            f"alembic_version holds {len(revisions)} revisions ({', '.join(revisions) or 'none'}): "
            "not an Airflow metadata database (Airflow's history has one head)"
        )
    if "dag" not in tables and schema_version(revisions[0]).airflow_version is None:
        raise DoctorError(
            f"alembic_version {revisions[0]} is no Airflow migration and there is no dag table: "
            "not an Airflow metadata database"
        )
    return revisions[0]


def _support(
    schema: SchemaVersion, found: shapes.QueueShape | None, shape_error: str | None
) -> tuple[bool, str, str | None]:
    """``(supported, why, tested release)`` for this schema."""
    if schema.airflow_version is None:
        return (
            False,
            f"alembic revision {schema.revision} is unknown to this airflow-adrq (it knows Airflow up to "
            f"{KNOWN_UP_TO}): a newer Airflow? Upgrade airflow-adrq",
            None,
        )
    line = schema.line
    name = f"{line[0]}.{line[1]}" if line else schema.airflow_version
    if line in compat.REFUSED:
        return False, f"Airflow {name} is refused: {compat.REFUSED[line]}", None
    adapter = compat.ADAPTERS.get(line) if line else None
    if adapter is None:
        supported_lines = ", ".join(f"{a}.{b}" for a, b in compat.SUPPORTED)
        return False, f"Airflow {name} is not supported (supported: {supported_lines})", None
    if found is None:
        return False, f"the queue table is not a shape airflow-adrq writes: {shape_error}", adapter.tested
    if found != adapter.shape:
        return (
            False,
            f"Airflow {name} makes the {adapter.shape.name} queue, this database has the {found.name} one "
            "(migrated by another Airflow?)",
            adapter.tested,
        )
    return True, f"Airflow {name}, tested with {adapter.tested}", adapter.tested


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _below_minimum(schema: SchemaVersion) -> list[str]:
    """A warning when releases of this schema predate the first one of its line the plug-in supports.

    The schema is the same from its release up to the next release that adds a
    migration, so it cannot tell which of those runs.
    """
    version, line = schema.airflow_version, schema.line
    if version is None or line not in compat.ADAPTERS:
        return []
    minimum = compat.ADAPTERS[line].minimum
    if _version_tuple(version) >= minimum:
        return []
    later = [v for _, v in REVISIONS if _version_tuple(v) > _version_tuple(version)]
    until = f" up to (not including) {later[0]}" if later else " and later"
    return [
        f"this is the schema of Airflow {version}{until}; the plug-in supports {line[0]}.{line[1]} "
        f"from {'.'.join(map(str, minimum))} on (see compat.py): check `airflow version`, older releases "
        "refuse to start with the option set"
    ]


def _primary_key(inspector: Inspector, schema: str | None) -> tuple[str, ...]:
    return tuple(
        inspector.get_pk_constraint("asset_dag_run_queue", schema=schema).get("constrained_columns") or ()
    )


def detect(connection: Connection, schema: str | None = None) -> shapes.QueueShape:
    """The :class:`~airflow_adrq.shapes.QueueShape` of the database behind ``connection``.

    Reads the catalog (columns of ``dag`` and ``asset_event``, the primary
    key of ``asset_dag_run_queue``, in ``schema`` if given) through the
    connection, inside the caller's transaction; takes no row locks. Raises
    :class:`~airflow_adrq.errors.UnsupportedSchemaError` for a queue keyed in
    any other way, or a combination no Airflow release has.
    """
    inspector = sa.inspect(connection)

    def columns(name: str) -> set[str]:
        if not inspector.has_table(name, schema=schema):
            return set()
        return {c["name"] for c in inspector.get_columns(name, schema=schema)}

    if not inspector.has_table("asset_dag_run_queue", schema=schema):
        raise UnsupportedSchemaError("no asset_dag_run_queue table: not an Airflow 3 metadata database")
    pk = _primary_key(inspector, schema)
    dag_columns, event_columns = columns("dag"), columns("asset_event")
    found = shapes.QueueShape(
        "detected",
        partitions="timetable_partitioned" in dag_columns and "partition_key" in event_columns,
        draining="is_draining" in dag_columns,
        event_keyed=set(pk) == set(shapes.EVENT_KEYED.queue_key),
    )
    known = [s for s in shapes.KNOWN if dataclasses.replace(found, name=s.name) == s]
    if set(pk) != set(found.queue_key) or "is_paused" not in dag_columns or not known:
        key = f"({', '.join(pk)})" if pk else "no primary key"
        relevant = sorted(dag_columns & {"is_paused", "timetable_partitioned", "is_draining"})
        raise UnsupportedSchemaError(
            f"asset_dag_run_queue has primary key {key}; dag has columns {', '.join(relevant) or 'none'} "
            "of is_paused, timetable_partitioned, is_draining: not an Airflow 3.0-3.4 schema airflow-adrq "
            "knows how to write."
        )
    return known[0]
