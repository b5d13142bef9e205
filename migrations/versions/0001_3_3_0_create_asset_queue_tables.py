"""Create Airflow 3.3's asset-queueing tables.

Revision ID: 9a8900d7a638
Revises:
Create Date: 2026-11-29 19:39:40

The tables ``airflow_adrq.models`` mirrors from ``apache-airflow-core==3.3.2``
(``dag`` and ``dag_bundle``: the documented column subsets). Every name is
spelled out, so the DDL does not depend on the MetaData Alembic is configured
with. A frozen copy, not ``metadata.create_all()``: a revision must keep creating
what it created when written, whatever the models become (``tests/migrations``
checks that head still equals the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Revision identifiers, used by Alembic.
revision: str = "9a8900d7a638"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MYSQL_FAMILY = ("mysql", "mariadb")
# Airflow's StringID: ids compare byte-wise on MySQL.
_STRING_ID = sa.String(250).with_variant(sa.String(250, collation="utf8mb3_bin"), *_MYSQL_FAMILY)
# Airflow's asset name/uri/group: latin1 so (name, uri) fits InnoDB's 3072-byte index key limit.
_ASSET_STRING = sa.String(1500).with_variant(sa.String(1500, collation="latin1_general_cs"), *_MYSQL_FAMILY)
# Airflow's UtcDateTime, as its TIMESTAMP(timezone=True) impl renders: TIMESTAMP WITH TIME ZONE
# on PostgreSQL, TIMESTAMP on SQLite, and TIMESTAMP(6) on MySQL (UtcDateTime.load_dialect_impl).
_UTC_DATETIME = sa.TIMESTAMP(timezone=True).with_variant(mysql.TIMESTAMP(fsp=6), *_MYSQL_FAMILY)


def _cascade(columns: list[str], targets: list[str], name: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(columns, targets, name=name, ondelete="CASCADE")


#: Tables given SQLite AUTOINCREMENT: SQLite must never reuse the id of a deleted row.
_AUTOINCREMENT = ("asset", "asset_alias", "asset_event")


def _tables() -> dict[str, tuple[sa.schema.SchemaItem, ...]]:
    """Each table's columns, keys and indexes, in creation order (fresh objects on every call)."""
    return {
        "dag_bundle": (
            sa.Column("name", _STRING_ID, nullable=False),
            sa.PrimaryKeyConstraint("name", name="dag_bundle_pkey"),
        ),
        "dag": (
            sa.Column("dag_id", _STRING_ID, nullable=False),
            sa.Column("is_paused", sa.Boolean(), nullable=False),
            sa.Column("is_stale", sa.Boolean(), nullable=False),
            sa.Column("exceeds_max_non_backfill", sa.Boolean(), nullable=False, server_default="0"),
            sa.Column("bundle_name", _STRING_ID, nullable=False),
            sa.Column("has_import_errors", sa.Boolean(), nullable=True, server_default="0"),
            sa.Column("timetable_partitioned", sa.Boolean(), nullable=False, server_default="0"),
            sa.Column("asset_expression", sa.JSON(), nullable=True),
            sa.Column("max_active_runs", sa.Integer(), nullable=True),
            sa.Column("next_dagrun_create_after", _UTC_DATETIME, nullable=True),
            sa.PrimaryKeyConstraint("dag_id", name="dag_pkey"),
            # Airflow gives this FK no ON DELETE rule.
            sa.ForeignKeyConstraint(["bundle_name"], ["dag_bundle.name"], name="dag_bundle_name_fkey"),
            sa.Index("idx_next_dagrun_create_after", "next_dagrun_create_after"),
        ),
        "asset": (
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("name", _ASSET_STRING, nullable=False),
            sa.Column("uri", _ASSET_STRING, nullable=False),
            sa.Column("group", _ASSET_STRING, nullable=False),
            sa.Column("extra", sa.JSON(), nullable=False),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.Column("updated_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("id", name="asset_pkey"),
            # Alembic creates it right after the table: before asset_active, whose FK references (name, uri).
            sa.Index("idx_asset_name_uri_unique", "name", "uri", unique=True),
        ),
        "asset_active": (
            sa.Column("name", _ASSET_STRING, nullable=False),
            sa.Column("uri", _ASSET_STRING, nullable=False),
            sa.PrimaryKeyConstraint("name", "uri", name="asset_active_pkey"),
            _cascade(["name", "uri"], ["asset.name", "asset.uri"], "asset_active_asset_name_uri_fkey"),
            sa.Index("idx_asset_active_name_unique", "name", unique=True),
            sa.Index("idx_asset_active_uri_unique", "uri", unique=True),
        ),
        "asset_alias": (
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("name", _ASSET_STRING, nullable=False),
            sa.Column("group", _ASSET_STRING, nullable=False),
            sa.PrimaryKeyConstraint("id", name="asset_alias_pkey"),
            sa.Index("idx_asset_alias_name_unique", "name", unique=True),
        ),
        "asset_alias_asset": (
            sa.Column("alias_id", sa.Integer(), nullable=False),
            sa.Column("asset_id", sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint("alias_id", "asset_id", name="asset_alias_asset_pkey"),
            _cascade(["alias_id"], ["asset_alias.id"], "asset_alias_asset_alias_id_fkey"),
            _cascade(["asset_id"], ["asset.id"], "asset_alias_asset_asset_id_fkey"),
            sa.Index("idx_asset_alias_asset_alias_id", "alias_id"),
            sa.Index("idx_asset_alias_asset_asset_id", "asset_id"),
        ),
        "asset_event": (
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            # No FK to asset: events outlive their asset, as in Airflow.
            sa.Column("asset_id", sa.Integer(), nullable=False),
            sa.Column("extra", sa.JSON(), nullable=False),
            sa.Column("source_task_id", _STRING_ID, nullable=True),
            sa.Column("source_dag_id", _STRING_ID, nullable=True),
            sa.Column("source_run_id", _STRING_ID, nullable=True),
            sa.Column("source_map_index", sa.Integer(), nullable=True, server_default="-1"),
            sa.Column("timestamp", _UTC_DATETIME, nullable=False),
            sa.Column("partition_key", _STRING_ID, nullable=True),
            sa.PrimaryKeyConstraint("id", name="asset_event_pkey"),
            sa.Index("idx_asset_id_timestamp", "asset_id", "timestamp"),
        ),
        "asset_alias_asset_event": (
            sa.Column("alias_id", sa.Integer(), nullable=False),
            sa.Column("event_id", sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint("alias_id", "event_id", name="asset_alias_asset_event_pkey"),
            _cascade(["alias_id"], ["asset_alias.id"], "asset_alias_asset_event_alias_id_fkey"),
            _cascade(["event_id"], ["asset_event.id"], "asset_alias_asset_event_event_id_fkey"),
            sa.Index("idx_asset_alias_asset_event_alias_id", "alias_id"),
            sa.Index("idx_asset_alias_asset_event_event_id", "event_id"),
        ),
        "dag_schedule_asset_reference": (
            sa.Column("asset_id", sa.Integer(), nullable=False),
            sa.Column("dag_id", _STRING_ID, nullable=False),
            sa.Column("allow_producer_teams", sa.JSON(), nullable=True),
            sa.Column("allow_global_producers", sa.Boolean(), nullable=False, server_default=sa.true()),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.Column("updated_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("asset_id", "dag_id", name="dsar_pkey"),
            _cascade(["asset_id"], ["asset.id"], "dsar_asset_fkey"),
            _cascade(["dag_id"], ["dag.dag_id"], "dsar_dag_id_fkey"),
            sa.Index("idx_dag_schedule_asset_reference_dag_id", "dag_id"),
        ),
        "dag_schedule_asset_alias_reference": (
            sa.Column("alias_id", sa.Integer(), nullable=False),
            sa.Column("dag_id", _STRING_ID, nullable=False),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.Column("updated_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("alias_id", "dag_id", name="dsaar_pkey"),
            _cascade(["alias_id"], ["asset_alias.id"], "dsaar_asset_alias_fkey"),
            _cascade(["dag_id"], ["dag.dag_id"], "dsaar_dag_id_fkey"),
            sa.Index("idx_dag_schedule_asset_alias_reference_dag_id", "dag_id"),
        ),
        "dag_schedule_asset_name_reference": (
            sa.Column("name", _ASSET_STRING, nullable=False),
            sa.Column("dag_id", _STRING_ID, nullable=False),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("name", "dag_id", name="dsanr_pkey"),
            # By-name reference: no FK to asset.
            _cascade(["dag_id"], ["dag.dag_id"], "dsanr_dag_id_fkey"),
            sa.Index("idx_dag_schedule_asset_name_reference_dag_id", "dag_id"),
        ),
        "dag_schedule_asset_uri_reference": (
            sa.Column("uri", _ASSET_STRING, nullable=False),
            sa.Column("dag_id", _STRING_ID, nullable=False),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("uri", "dag_id", name="dsaur_pkey"),
            _cascade(["dag_id"], ["dag.dag_id"], "dsaur_dag_id_fkey"),
            sa.Index("idx_dag_schedule_asset_uri_reference_dag_id", "dag_id"),
        ),
        "asset_dag_run_queue": (
            sa.Column("asset_id", sa.Integer(), nullable=False),
            sa.Column("target_dag_id", _STRING_ID, nullable=False),
            sa.Column("created_at", _UTC_DATETIME, nullable=False),
            sa.PrimaryKeyConstraint("asset_id", "target_dag_id", name="assetdagrunqueue_pkey"),
            _cascade(["asset_id"], ["asset.id"], "adrq_asset_fkey"),
            _cascade(["target_dag_id"], ["dag.dag_id"], "adrq_dag_fkey"),
            sa.Index("idx_asset_dag_run_queue_target_dag_id", "target_dag_id"),
        ),
    }


def upgrade() -> None:
    """Create the asset, DAG and queue tables with Airflow 3.3.2's names."""
    for name, elements in _tables().items():
        op.create_table(name, *elements, sqlite_autoincrement=name in _AUTOINCREMENT)


def downgrade() -> None:
    """Drop every table this revision created, children before parents (reverse creation order)."""
    # Dropping a table drops its indexes and constraints with it.
    for name in reversed(_tables()):
        op.drop_table(name)
