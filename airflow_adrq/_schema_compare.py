"""How a reflected schema is compared with ``airflow_adrq.models`` (Alembic autogenerate hooks).

Alembic's default comparison is used everywhere except where the MySQL
family reports the same schema in a different spelling. Each exception below
is narrow: it accepts exactly the spelling the server produces for what the
models declare, and reports anything else as a difference (never a blanket
"ignore this column").
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import mysql

from airflow_adrq.models import metadata

__all__ = ["compare_server_default", "compare_type", "include_name"]

_MYSQL_FAMILY = ("mysql", "mariadb")

# MariaDB's JSON is an alias: the column is created as LONGTEXT with this
# collation and a column-level CHECK (json_valid(`col`)) named after the
# column (https://mariadb.com/kb/en/json-data-type/). SQLAlchemy reflects the
# LONGTEXT, so without this rule every JSON column would look changed (or,
# with Alembic's JSON/LONGTEXT synonym alone, a plain LONGTEXT would pass).
_MARIADB_JSON_COLLATION = "utf8mb4_bin"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the models' tables (not the version table, ``sqlite_sequence`` or others')."""
    if type_ == "table":
        return name in metadata.tables
    return True


def compare_type(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_type: sa.types.TypeEngine[Any],
    metadata_type: sa.types.TypeEngine[Any],
) -> bool | None:
    """``True``: types differ; ``False``: same; ``None``: let Alembic decide."""
    dialect = context.dialect
    if dialect.name not in _MYSQL_FAMILY:
        return None
    if not isinstance(metadata_type.dialect_impl(dialect), sa.JSON):
        return None
    if isinstance(inspected_type, mysql.JSON):
        return False  # MySQL 8: a native JSON column.
    if (
        getattr(dialect, "is_mariadb", False)
        and isinstance(inspected_type, mysql.LONGTEXT)
        and inspected_type.collation == _MARIADB_JSON_COLLATION
    ):
        table = inspected_column.table.name
        return not _has_mariadb_json_check(context, table, inspected_column.name)
    return True


def compare_server_default(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_default: str | None,
    metadata_default: Any,
    rendered_metadata_default: str | None,
) -> bool | None:
    """``True``: defaults differ; ``False``: same; ``None``: let Alembic decide."""
    if context.dialect.name not in _MYSQL_FAMILY or not isinstance(metadata_column.type, sa.Boolean):
        return None
    if inspected_default is None or rendered_metadata_default is None:
        return None
    # BOOL is TINYINT(1) on MySQL/MariaDB: DEFAULT true is stored, and
    # reflected, as 1 (false as 0). Only these two spellings are mapped.
    return _mysql_bool_literal(inspected_default) != _mysql_bool_literal(rendered_metadata_default)


def _mysql_bool_literal(default: str) -> str:
    text = default.strip().strip("'").lower()
    return {"true": "1", "false": "0"}.get(text, text)


def _has_mariadb_json_check(context: MigrationContext, table: str, column: str) -> bool:
    check = sa.table(
        "CHECK_CONSTRAINTS",
        sa.column("constraint_schema"),
        sa.column("table_name"),
        sa.column("constraint_name"),
        sa.column("check_clause"),
        schema="information_schema",
    )
    connection = context.connection
    if connection is None:  # offline mode: nothing to look at
        return False
    clause = connection.execute(
        sa.select(check.c.check_clause).where(
            check.c.constraint_schema == sa.func.database(),
            check.c.table_name == table,
            check.c.constraint_name == column,
        )
    ).scalar_one_or_none()
    return clause is not None and clause.replace(" ", "") == f"json_valid(`{column}`)"
