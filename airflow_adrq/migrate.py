"""Create and upgrade airflow-adrq's *own* database with Alembic.

For a standalone database (tests, benchmarks, trying the library). Airflow's
migrations created the same tables in its metadata database, so every command
first refuses a database that holds Airflow's schema: ``upgrade`` would fail
half-way there, and ``downgrade`` would drop Airflow's tables with their rows.
Alembic is configured in code (no ``alembic.ini``); the revision is kept in
``airflow_adrq_version``, never Airflow's ``alembic_version``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import Script, ScriptDirectory
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Connection, Engine

from airflow_adrq import dialects
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import AdrqError, AirflowSchemaError
from airflow_adrq.models import metadata
from airflow_adrq.tables import MYSQL_FAMILY

__all__ = [
    "VERSION_TABLE",
    "CheckResult",
    "MigrationResult",
    "Step",
    "alembic_config",
    "check",
    "comparison_options",
    "current",
    "describe_diff",
    "downgrade",
    "heads",
    "schema_diff",
    "script_location",
    "upgrade",
]

#: Alembic's version table for airflow-adrq; ``alembic_version`` would mix in Airflow's history.
VERSION_TABLE = "airflow_adrq_version"

#: Tables that mean "an Airflow metadata database": Airflow's Alembic version table, and ``dag_run``
#: (in every Airflow schema since 1.x; airflow-adrq never creates it).
_AIRFLOW_MARKERS = ("alembic_version", "dag_run")

#: The ``Config.attributes`` key of the callback that ``migrations/env.py`` gives each applied revision.
ON_VERSION_APPLY = "airflow_adrq.on_version_apply"

Bind = str | URL | Engine


@dataclass(frozen=True)
class Step:
    """One revision applied (``upgrade``) or reverted (``downgrade``)."""

    direction: Literal["upgrade", "downgrade"]
    revision: str
    doc: str


@dataclass(frozen=True)
class MigrationResult:
    """What :func:`upgrade` or :func:`downgrade` did."""

    before: str | None
    after: str | None
    steps: tuple[Step, ...]
    tables_created: tuple[str, ...]
    tables_dropped: tuple[str, ...]


@dataclass(frozen=True)
class CheckResult:
    """What :func:`check` found. ``ok`` means at head and no schema difference."""

    current: str | None
    head: str
    diffs: tuple[Any, ...] = ()

    @property
    def ok(self) -> bool:
        return self.current == self.head and not self.diffs


def script_location() -> Path:
    """The Alembic script directory: ``airflow_adrq/migrations`` in a wheel, ``migrations/`` in a checkout."""
    package = Path(__file__).resolve().parent
    for location in (package / "migrations", package.parent / "migrations"):
        # Alembic imports env.py and the revisions from real files (not from a zip, say).
        if (location / "env.py").is_file():
            return location
    raise AdrqError(f"airflow-adrq's migrations are not on the file system next to {package}")


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic :class:`~alembic.config.Config` built in code, for ``connection``.

    To author a revision: ``command.revision(alembic_config(conn), "add x", autogenerate=True)``.
    """
    config = Config()
    location = script_location()
    # ConfigParser interpolates "%", which may appear in a path.
    config.set_main_option("script_location", str(location).replace("%", "%%"))
    config.set_main_option("version_locations", str(location / "versions").replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def heads() -> tuple[str, ...]:
    """The head revision(s) of the migration scripts (one, unless history forked)."""
    return tuple(ScriptDirectory.from_config(alembic_config()).get_heads())


def _refuse_airflow_schema(connection: Connection) -> None:
    """Raise :class:`~airflow_adrq.errors.AirflowSchemaError` if the default schema has a marker table.

    Reads the catalog and ``alembic_version``'s rows (for the message); changes nothing. Not
    promised: a database that gains Airflow's tables after this check is not detected.
    """
    inspector = sa.inspect(connection)
    found = []
    for name in _AIRFLOW_MARKERS:
        if not inspector.has_table(name):
            continue
        if name == "alembic_version" and "version_num" in {c["name"] for c in inspector.get_columns(name)}:
            revisions = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
            name += f" (revision {', '.join(map(str, revisions)) or 'none'})"
        found.append(name)
    if found:
        raise AirflowSchemaError(
            f"refusing to run airflow-adrq migrations on {_shown(connection)}: it holds Apache Airflow's "
            f"own schema (found {', '.join(found)}). Airflow's migrations own these tables and airflow-adrq "
            "needs no migration there; `airflow-adrq db` is only for a database of its own. "
            "Nothing was changed."
        )


def _shown(connection: Connection) -> str:
    return connection.engine.url.render_as_string(hide_password=True)


def upgrade(bind: Bind, revision: str = "head") -> MigrationResult:
    """Upgrade the database to ``revision`` (default: head), in one transaction.

    Refuses, before any DDL, a database that holds Airflow's schema and, on a first upgrade (no
    ``airflow_adrq_version``), one that already has a table it would create (``CREATE TABLE`` would
    fail part-way). Locks: the DDL's (``ACCESS EXCLUSIVE`` on PostgreSQL, SQLite's write lock) until
    COMMIT. A failure raises :class:`~airflow_adrq.errors.AdrqError` and leaves the database as found
    (MySQL/MariaDB commit each DDL statement: the tables this run created are dropped again).

    Not promised: two concurrent upgrades of the same database are not serialised (one fails on
    tables the other created).
    """
    return _migrate(bind, "upgrade", revision)


def downgrade(bind: Bind, revision: str) -> MigrationResult:
    """Downgrade the database to ``revision`` (``"base"`` drops every airflow-adrq table).

    Same transaction, locking and refusal rules as :func:`upgrade`. There is
    no default revision on purpose: a downgrade deletes data.
    """
    return _migrate(bind, "downgrade", revision)


def current(bind: Bind) -> str | None:
    """The revision recorded in ``airflow_adrq_version``, or ``None`` for an unmigrated database.

    Read-only; refuses an Airflow database. On SQLite the engine's ``BEGIN IMMEDIATE`` holds the
    write lock for the read.
    """
    with _connect(bind) as connection:
        return _current(connection)


def check(bind: Bind) -> CheckResult:
    """The current and head revisions and the :func:`schema_diff` (like ``alembic check``).

    Read-only; locks as :func:`current` does.
    """
    (head,) = heads()
    with _connect(bind) as connection:
        return CheckResult(current=_current(connection), head=head, diffs=tuple(schema_diff(connection)))


def schema_diff(connection: Connection) -> list[Any]:
    """Alembic autogenerate's differences between the database and ``airflow_adrq.models``.

    Only the models' tables are compared (:func:`comparison_options`); an empty list: the models' schema.
    """
    context = MigrationContext.configure(connection, opts=comparison_options())
    return list(compare_metadata(context, metadata))


def describe_diff(diff: Any) -> str:
    """One line for one :func:`schema_diff` entry, e.g. ``add_index idx_x on dag``."""
    if isinstance(diff, list):  # changes to one column come as a list of modify_* tuples
        return "; ".join(describe_diff(item) for item in diff)
    kind = diff[0]
    if kind.startswith("modify_"):
        # ("modify_type", schema, table, column, existing, old, new)
        _kind, _schema, table, column, _existing, *values = diff
        old, new = (
            str(getattr(v.arg, "text", v.arg)) if isinstance(v, sa.schema.DefaultClause) else repr(v)
            for v in values
        )
        return f"{kind} {table}.{column}: {old} -> {new}"
    if kind in ("add_column", "remove_column"):
        # ("add_column", schema, table, Column)
        _kind, _schema, table, column = diff
        return f"{kind} {table}.{column.name}"
    # ("add_table", Table), ("remove_index", Index), ("add_fk", ForeignKeyConstraint), ...
    obj = diff[1]
    table = getattr(obj, "table", None)
    where = f" on {table.name}" if table is not None else ""
    return f"{kind} {obj.name}{where}"


def comparison_options() -> dict[str, Any]:
    """``MigrationContext`` options shared by :func:`schema_diff` and ``migrations/env.py``.

    So ``db check`` and an autogenerated revision see the same differences: Alembic's default
    comparison of the models' tables, except where the MySQL family spells the same schema
    differently. Each exception accepts exactly the server's spelling of what the models declare
    and reports anything else as a difference: never a blanket "ignore this column".
    """
    return {
        "version_table": VERSION_TABLE,
        "compare_type": _compare_type,
        "compare_server_default": _compare_server_default,
        "include_name": _include_name,
    }


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the models' tables (not the version table, ``sqlite_sequence`` or others')."""
    return type_ != "table" or name in metadata.tables


def _compare_type(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_type: sa.types.TypeEngine[Any],
    metadata_type: sa.types.TypeEngine[Any],
) -> bool | None:
    """``True``: types differ; ``False``: same; ``None``: let Alembic decide.

    MariaDB's JSON is an alias: a LONGTEXT with collation ``utf8mb4_bin`` and a column-level
    ``CHECK (json_valid(`col`))`` named after the column (https://mariadb.com/kb/en/json-data-type/).
    SQLAlchemy reflects the LONGTEXT: without this rule every JSON column would look changed (and
    with Alembic's JSON/LONGTEXT synonym alone, a plain LONGTEXT would pass).
    """
    dialect = context.dialect
    if dialect.name not in MYSQL_FAMILY or not isinstance(metadata_type.dialect_impl(dialect), sa.JSON):
        return None
    if isinstance(inspected_type, mysql.JSON):
        return False  # MySQL 8: a native JSON column.
    if (
        getattr(dialect, "is_mariadb", False)
        and isinstance(inspected_type, mysql.LONGTEXT)
        and inspected_type.collation == "utf8mb4_bin"
        and context.connection is not None  # offline mode: nothing to look at
    ):
        column = inspected_column.name
        clause = context.connection.execute(
            sa.text(
                "SELECT check_clause FROM information_schema.CHECK_CONSTRAINTS WHERE constraint_schema = "
                "DATABASE() AND table_name = :table AND constraint_name = :column"
            ),
            {"table": inspected_column.table.name, "column": column},
        ).scalar_one_or_none()
        return clause is None or clause.replace(" ", "") != f"json_valid(`{column}`)"
    return True


def _compare_server_default(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_default: str | None,
    metadata_default: Any,
    rendered_metadata_default: str | None,
) -> bool | None:
    """``True``: defaults differ; ``False``: same; ``None``: let Alembic decide.

    BOOL is TINYINT(1) on MySQL/MariaDB: DEFAULT true is stored, and
    reflected, as 1 (false as 0). Only these two spellings are mapped.
    """
    if context.dialect.name not in MYSQL_FAMILY or not isinstance(metadata_column.type, sa.Boolean):
        return None
    if inspected_default is None or rendered_metadata_default is None:
        return None
    return _bool_literal(inspected_default) != _bool_literal(rendered_metadata_default)


def _bool_literal(default: str) -> str:
    text = default.strip().strip("'").lower()
    return {"true": "1", "false": "0"}.get(text, text)


def _migrate(bind: Bind, direction: Literal["upgrade", "downgrade"], revision: str) -> MigrationResult:
    steps: list[Step] = []

    def record(*, step: MigrationInfo, **_: Any) -> None:
        doc = step.up_revision.doc.strip() if isinstance(step.up_revision, Script) else ""
        steps.append(Step("upgrade" if step.is_upgrade else "downgrade", step.up_revision_id or "", doc))

    with _connect(bind) as connection:
        before = _current(connection)
        tables_before = set(sa.inspect(connection).get_table_names())
        clash = sorted(tables_before & set(metadata.tables))
        if direction == "upgrade" and before is None and clash:
            raise AdrqError(
                f"refusing to upgrade {_shown(connection)}: it has no {VERSION_TABLE} but already has the "
                f"table(s) {', '.join(clash)} that airflow-adrq would create. Use an empty database, or drop "
                "those tables first. Nothing was changed."
            )
        config = alembic_config(connection)
        config.attributes[ON_VERSION_APPLY] = record
        try:
            getattr(command, direction)(config, revision)
        except Exception as exc:
            if direction == "upgrade" and not dialects.get(connection).transactional_ddl:
                # DDL commits here (MySQL/MariaDB): drop what this run created (elsewhere: the rollback).
                created = set(sa.inspect(connection).get_table_names()) - tables_before
                for table in reversed(metadata.sorted_tables):
                    if table.name in created:
                        table.drop(connection, checkfirst=True)
                if VERSION_TABLE in created:
                    sa.Table(VERSION_TABLE, sa.MetaData()).drop(connection, checkfirst=True)
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            raise AdrqError(
                f"{direction} to {revision} failed: {first[0] if first else type(exc).__name__}. "
                "The database was left as it was found; fix the cause and run the command again."
            ) from exc
        after = _current(connection)
        # A fresh inspector: the first one cached the table names.
        tables_after = set(sa.inspect(connection).get_table_names())
    ours = tables_after ^ tables_before
    return MigrationResult(
        before=before,
        after=after,
        steps=tuple(steps),
        tables_created=tuple(sorted(ours & tables_after)),
        tables_dropped=tuple(sorted(ours & tables_before)),
    )


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


@contextlib.contextmanager
def _connect(bind: Bind) -> Iterator[Connection]:
    """One connection in one transaction, committed on success, refused first if Airflow's database."""
    # A missing driver raises DriverNotInstalledError, naming the extra that installs it.
    engine = bind if isinstance(bind, Engine) else create_engine(bind, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as connection:
            _refuse_airflow_schema(connection)
            yield connection
    finally:
        if engine is not bind:
            engine.dispose()
