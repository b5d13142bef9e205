"""How ``db check`` compares a reflected schema with ``airflow_adrq.models`` (Alembic autogenerate hooks).

Alembic's default comparison everywhere except where the MySQL family
reports the same schema in another spelling. Each exception accepts exactly
the spelling the server produces for what the models declare and reports
anything else as a difference: never a blanket "ignore this column".
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import mysql

from airflow_adrq.models import metadata
from airflow_adrq.tables import MYSQL_FAMILY

__all__ = ["compare_server_default", "compare_type", "include_name"]


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only the models' tables (not the version table, ``sqlite_sequence`` or others')."""
    return type_ != "table" or name in metadata.tables


def compare_type(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_type: sa.types.TypeEngine[Any],
    metadata_type: sa.types.TypeEngine[Any],
) -> bool | None:
    """``True``: types differ; ``False``: same; ``None``: let Alembic decide.

    MariaDB's JSON is an alias: a LONGTEXT with collation ``utf8mb4_bin`` and a
    column-level ``CHECK (json_valid(`col`))`` named after the column
    (https://mariadb.com/kb/en/json-data-type/). SQLAlchemy reflects the
    LONGTEXT: without this rule every JSON column would look changed (and with
    Alembic's JSON/LONGTEXT synonym alone, a plain LONGTEXT would pass).
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


def compare_server_default(
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
