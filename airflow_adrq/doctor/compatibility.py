"""The compatibility half of the report: Airflow's schema version, the queue's shape, the plug-in's support.

:func:`schema_version` places an ``alembic_version`` revision in Airflow's
migration history; :func:`detect` reads the queue's shape off the catalog (the
plug-in does not: it writes its release line's); :mod:`airflow_adrq.airflow.compat`
says which release lines the plug-in supports and which shape each makes.

:data:`REVISIONS` was generated from the ``airflow/migrations/versions/*.py``
files of the ``apache-airflow-core`` wheels 3.0.6, 3.1.8, 3.2.2, 3.3.2 and
3.4.0b2 (each file's ``revision`` and ``airflow_version``; every older wheel's
revisions are a prefix of 3.4.0b2's chain, which is linear; ``0000`` is
Airflow 3's squash of every 2.x migration up to 2.6.2). A revision it does not
know is looked up in an installed Airflow's migration files.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Inspector

from airflow_adrq import shapes
from airflow_adrq.airflow import compat
from airflow_adrq.doctor.backends import Probe, scalar
from airflow_adrq.doctor.report import Compatibility, DoctorError, SchemaVersion
from airflow_adrq.errors import UnsupportedSchemaError

__all__ = ["KNOWN_UP_TO", "REVISIONS", "detect", "read", "schema_version"]

#: The newest release :data:`REVISIONS` was read from.
KNOWN_UP_TO = "3.4.0b2"

# One release a line (indented lines continue it), its revisions in file order: 0000 first, 0147 last.
_BY_RELEASE = """
2.6.2   4bc4d934e2bc
2.7.0   937cbd173ca1 788397e78828 405de8318b3a
2.8.0   375a816bbbf4 f7bf2a57d0a6 bd5dfbe21f88 10b52ebd31f7
2.8.1   88344c1d9134
2.9.0   1fd565369930 d75389605139 ab34f260b71c 8e1c784a4fc7 b4078ac230a1 ee1467d4aa35 1949afb29106
2.9.2   bff083ad727d 686269002441
2.10.0  0fd0c178cbe8 677fdbb7fc54 c4602ba06b4b d482b7261ff9 05e19f3176be ec3471c1e067 41b3bc7c0272
        8684e37832e6 22ed7efa9da2
2.10.3  5f2621c13b39
3.0.0   044f740568ec d0f1c55954fa 0bfc26bc256e a2c32e6c7729 1cdc775ca98f 522625f6d606 16cbcb1c8c36
        44eabb1904b4 0d9e73a75ee4 c3389cd7793f 5a5d66100783 fb2d4922cd79 3a8972ecb8f9 05234396c6fc
        d59cbbef95eb 486ac7936b78 5f57a45b8433 d8cd3297971e d03e4a635aa3 2b47dc6bc8df 9fc3fc5de720
        eed27faa34e3 e229247a6cb1 038dc8bc6284 237cef8dfea1 5c9c0231baa2 38770795785f e39a26ac59f6
        8ea135928435 33b04e4bfa19 6a9e7a527a88 e00344393f31 7645189f3479 cf87489a35df 16f7f5ee874e
        d469d27e2a64 be2cc2f742cf ec62e120484d 0e9519b56710 959e216a3abb 29ce7909c52b
3.0.3   fe199e1abd77
3.1.0   dfee8bd5d574 0242ac120002 3ac9e5732b1f 583e80dfcef4 66a7743fe20e ffdb0566c7c0 40f7c30a228b
        09fa89ba1710 f56f68b9e02f 3bda03debd04 808787349f22 a169942745c2 7582ea3f3dd5 a3c7f2b18d4e
        eaf332f43c7c cc92b33c6709
3.1.8   82dbd68e6171 509b94a1042d
3.2.0   15d84ca19038 ab6dc0c82d0e 1b2c3d4e5f6g 5cc8117e9285 69ddce9a7247 b87d2135fa50 e812941398f4
        665854ef0536 b12d4f98a91e edc4f85a4619 c47f2e1ab9d4 0b112f49112d e79fc784f145 55297ae24532
        a5a3e5eb9b8d 53ff648b8a26 f8c9d7e6b5a4 e42d9fcd10d9 134de42d3cb0 6222ce48e289 888b59e02a5b
        1d6611b6ab7c
3.3.0   a4c2d171ae18 9fabad868fdb fde9ed84d07b b8f3e4a1d2c9 a7f3b2c1d4e5 a1b2c3d4e5f6 acc215baed80
        8812eb67b63c a7e6d4c3b2f1 c9d4e5f6a7b8 c20871fbf23a dd5f3a8e2b91 9ff64e1c35d3 d2f4e1b3c5a7
3.4.0   5a5d3253e946 436dc127462c c4e7a1f9b2d0 7a98f1b7dbd3 b2f1a9c7d4e0 3c525f44bea8 76c46545c91e
        c7f0a5d2e9b4 8d3f1a6b2c47 f8c2a1d94e03 b6a9c2e7d410 5182d0596ee2 3b7a91c5df20 c9f4b3e7a218
        a61f0c9d2b47 ca8499dc1004 e5a91c7f42b3 90e4d18ccadf e7c2a91bd540 54a27b6f9d01 7f8c9a2d410e
        c3e7a9182f64 a5d7b9c13e40 9cffe90fa0c0
"""


def _parse(table: str) -> tuple[tuple[str, str], ...]:
    revisions: list[tuple[str, str]] = []
    for line in table.strip().splitlines():
        if not line.startswith(" "):
            version, line = line.split(maxsplit=1)
        revisions.extend((revision, version) for revision in line.split())
    return tuple(revisions)


#: ``(revision, airflow_version)`` in migration order, oldest first.
REVISIONS = _parse(_BY_RELEASE)


def schema_version(revision: str) -> SchemaVersion:
    """Place an ``alembic_version`` revision: in :data:`REVISIONS`, else in an installed Airflow's."""
    revisions = REVISIONS if revision in dict(REVISIONS) else _installed_airflow_revisions()
    version = dict(revisions).get(revision)
    if version is None:
        return SchemaVersion(revision, None, None, False)
    last = [r for r, v in revisions if v == version][-1]
    return SchemaVersion(revision, version, compat.release_line(version), revision == last)


def _installed_airflow_revisions() -> tuple[tuple[str, str], ...]:
    """``(revision, airflow_version)`` of an installed Airflow's migration files, read as text.

    Finds the package without importing it (importing Airflow loads its configuration).
    """
    try:
        spec = importlib.util.find_spec("airflow")
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    versions = Path(next(iter(spec.submodule_search_locations))) / "migrations" / "versions"
    found = []
    for path in sorted(versions.glob("[0-9][0-9][0-9][0-9]_*.py")):
        text = path.read_text(errors="replace")
        revision = re.search(r'^revision\s*=\s*["\'](\w+)["\']', text, re.M)
        version = re.search(r'^airflow_version\s*=\s*["\']([^"\']+)["\']', text, re.M)
        if revision and version:
            found.append((revision[1], version[1]))
    return tuple(found)


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
    queue_key = _primary_key(inspector, schema) if "asset_dag_run_queue" in tables else None
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
        dag_id_collations=probe.collations(conn) if "dag" in tables else {},
    )
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
    line = schema.line
    name = f"{line[0]}.{line[1]}" if line else schema.airflow_version
    adapter = compat.ADAPTERS.get(line) if line else None
    if schema.airflow_version is None:
        why = (
            f"alembic revision {schema.revision} is unknown to this airflow-adrq (it knows Airflow up to "
            f"{KNOWN_UP_TO}): a newer Airflow? Upgrade airflow-adrq"
        )
    elif line in compat.REFUSED:
        why = f"Airflow {name} is refused: {compat.REFUSED[line]}"
    elif adapter is None:
        supported_lines = ", ".join(f"{a}.{b}" for a, b in compat.SUPPORTED)
        why = f"Airflow {name} is not supported (supported: {supported_lines})"
    elif found is None:
        why = f"the queue table is not a shape airflow-adrq writes: {shape_error}"
    elif found != adapter.shape:
        why = (
            f"Airflow {name} makes the {adapter.shape.name} queue, this database has the {found.name} one "
            "(migrated by another Airflow?)"
        )
    else:
        return True, f"Airflow {name}, tested with {adapter.tested}", adapter.tested
    return False, why, adapter.tested if adapter else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _below_minimum(schema: SchemaVersion) -> list[str]:
    """A warning when releases of this schema predate the first one of its line the plug-in supports.

    A schema is the same from its release up to the next one adding a migration: which runs is unknown.
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

    Reads the catalog (columns of ``dag`` and ``asset_event``, the primary key of
    ``asset_dag_run_queue``, in ``schema`` if given) in the caller's transaction;
    takes no row locks. :class:`~airflow_adrq.errors.UnsupportedSchemaError`: a
    queue keyed in any other way, or a combination no Airflow release has.
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
