"""Airflow-identical tables for the asset-queueing path (Airflow 3.3's, as 3.2's).

Every table, column, key, foreign key (with its ON DELETE) and index name matches
``apache-airflow-core==3.3.2``, with the same types, lengths and MySQL collations, so the SQL this
package builds runs unchanged against an Airflow metadata database. ``dag`` and ``dag_bundle`` are
subsets: the columns the queueing path reads, or that are NOT NULL without a default. Types come from
the annotations (:attr:`Base.type_annotation_map`), nullability from ``| None``. Unlike Airflow, with
the same DDL: ``StringID`` always carries ``utf8mb3_bin`` on MySQL/MariaDB (a dialect variant; Airflow
decides at import time from ``[database] sql_alchemy_conn``); no ORM relationships.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import (
    JSON,
    Column,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from airflow_adrq.tables import MYSQL_FAMILY, UtcDateTime, utcnow

__all__ = [
    "ID_LEN",
    "AssetActive",
    "AssetAliasModel",
    "AssetDagRunQueue",
    "AssetEvent",
    "AssetModel",
    "Base",
    "DagBundleModel",
    "DagModel",
    "DagScheduleAssetAliasReference",
    "DagScheduleAssetNameReference",
    "DagScheduleAssetReference",
    "DagScheduleAssetUriReference",
    "UtcDateTime",
    "alias_association_table",
    "asset_alias_asset_event_association_table",
    "metadata",
    "utcnow",
]

# Airflow's naming convention (airflow/models/base.py): unnamed constraints such as ``asset_pkey`` or
# ``asset_alias_asset_alias_id_fkey`` get their names from here, exactly as in Airflow.
metadata = MetaData(
    naming_convention={
        "ix": "idx_%(column_0_N_label)s",
        "uq": "%(table_name)s_%(column_0_N_name)s_uq",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "%(table_name)s_%(column_0_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    }
)

ID_LEN = 250
#: Airflow's ``StringID`` (dag, task, run ids): VARCHAR(250).
StrID = Annotated[str, "StringID"]
#: Airflow's asset name/uri/group: VARCHAR(1500).
AssetStr = Annotated[str, "AssetString"]


def _cascade(columns: list[str], targets: list[str], name: str) -> ForeignKeyConstraint:
    return ForeignKeyConstraint(columns, targets, name=name, ondelete="CASCADE")


class Base(DeclarativeBase):
    metadata = metadata
    # MySQL/MariaDB only: Airflow's collations. ids are compared byte-wise (utf8mb3_bin); asset
    # names/URIs are latin1 so that (name, uri) fits InnoDB's 3072-byte index key limit.
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        StrID: String(ID_LEN).with_variant(String(ID_LEN, collation="utf8mb3_bin"), *MYSQL_FAMILY),
        AssetStr: String(1500).with_variant(String(1500, collation="latin1_general_cs"), *MYSQL_FAMILY),
        dt.datetime: UtcDateTime,
        dict[str, Any]: JSON,
        list[str]: JSON,
    }


class DagBundleModel(Base):
    """``dag_bundle`` (subset: ``name``), the parent of ``dag.bundle_name``."""

    __tablename__ = "dag_bundle"

    name: Mapped[StrID] = mapped_column(primary_key=True)


class DagModel(Base):
    """``dag``: the subset of Airflow's columns the queueing path reads or must fill."""

    __tablename__ = "dag"

    dag_id: Mapped[StrID] = mapped_column(primary_key=True)
    # Airflow's ORM default is [core] dags_are_paused_at_creation; no server default: callers set it.
    is_paused: Mapped[bool]
    is_stale: Mapped[bool] = mapped_column(default=True)
    exceeds_max_non_backfill: Mapped[bool] = mapped_column(default=False, server_default="0")
    bundle_name: Mapped[StrID] = mapped_column(ForeignKey("dag_bundle.name"))
    has_import_errors: Mapped[bool | None] = mapped_column(default=False, server_default="0")
    timetable_partitioned: Mapped[bool] = mapped_column(server_default="0")
    asset_expression: Mapped[dict[str, Any] | None]
    max_active_runs: Mapped[int | None]
    next_dagrun_create_after: Mapped[dt.datetime | None]

    __table_args__ = (Index("idx_next_dagrun_create_after", "next_dagrun_create_after", unique=False),)


alias_association_table = Table(
    "asset_alias_asset",
    metadata,
    Column("alias_id", ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True),
    Column("asset_id", ForeignKey("asset.id", ondelete="CASCADE"), primary_key=True),
    Index("idx_asset_alias_asset_alias_id", "alias_id"),
    Index("idx_asset_alias_asset_asset_id", "asset_id"),
)

asset_alias_asset_event_association_table = Table(
    "asset_alias_asset_event",
    metadata,
    Column("alias_id", ForeignKey("asset_alias.id", ondelete="CASCADE"), primary_key=True),
    Column("event_id", ForeignKey("asset_event.id", ondelete="CASCADE"), primary_key=True),
    Index("idx_asset_alias_asset_event_alias_id", "alias_id"),
    Index("idx_asset_alias_asset_event_event_id", "event_id"),
)


class AssetAliasModel(Base):
    __tablename__ = "asset_alias"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[AssetStr]
    group: Mapped[AssetStr] = mapped_column(default="")

    __table_args__ = (
        Index("idx_asset_alias_name_unique", "name", unique=True),
        {"sqlite_autoincrement": True},  # ensures PK values are not reused
    )


class AssetModel(Base):
    __tablename__ = "asset"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[AssetStr]
    uri: Mapped[AssetStr]
    group: Mapped[AssetStr] = mapped_column(default=str)
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __table_args__ = (
        Index("idx_asset_name_uri_unique", "name", "uri", unique=True),
        {"sqlite_autoincrement": True},
    )


class AssetActive(Base):
    """``asset_active``: name and URI are each unique among active assets."""

    __tablename__ = "asset_active"

    name: Mapped[AssetStr]
    uri: Mapped[AssetStr]

    __table_args__ = (
        PrimaryKeyConstraint("name", "uri", name="asset_active_pkey"),
        _cascade(["name", "uri"], ["asset.name", "asset.uri"], "asset_active_asset_name_uri_fkey"),
        Index("idx_asset_active_name_unique", "name", unique=True),
        Index("idx_asset_active_uri_unique", "uri", unique=True),
    )


class DagScheduleAssetNameReference(Base):
    """``dag_schedule_asset_name_reference``: a DAG scheduled on ``Asset.ref(name=...)``."""

    __tablename__ = "dag_schedule_asset_name_reference"

    name: Mapped[AssetStr]
    dag_id: Mapped[StrID]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        PrimaryKeyConstraint("name", "dag_id", name="dsanr_pkey"),
        _cascade(["dag_id"], ["dag.dag_id"], "dsanr_dag_id_fkey"),
        Index("idx_dag_schedule_asset_name_reference_dag_id", "dag_id"),
    )


class DagScheduleAssetUriReference(Base):
    """``dag_schedule_asset_uri_reference``: a DAG scheduled on ``Asset.ref(uri=...)``."""

    __tablename__ = "dag_schedule_asset_uri_reference"

    uri: Mapped[AssetStr]
    dag_id: Mapped[StrID]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        PrimaryKeyConstraint("uri", "dag_id", name="dsaur_pkey"),
        _cascade(["dag_id"], ["dag.dag_id"], "dsaur_dag_id_fkey"),
        Index("idx_dag_schedule_asset_uri_reference_dag_id", "dag_id"),
    )


class DagScheduleAssetAliasReference(Base):
    """``dag_schedule_asset_alias_reference``: a DAG scheduled on an asset alias."""

    __tablename__ = "dag_schedule_asset_alias_reference"

    alias_id: Mapped[int]
    dag_id: Mapped[StrID]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __table_args__ = (
        PrimaryKeyConstraint("alias_id", "dag_id", name="dsaar_pkey"),
        _cascade(["alias_id"], ["asset_alias.id"], "dsaar_asset_alias_fkey"),
        _cascade(["dag_id"], ["dag.dag_id"], "dsaar_dag_id_fkey"),
        Index("idx_dag_schedule_asset_alias_reference_dag_id", "dag_id"),
    )


class DagScheduleAssetReference(Base):
    """``dag_schedule_asset_reference``: a DAG scheduled directly on an asset."""

    __tablename__ = "dag_schedule_asset_reference"

    asset_id: Mapped[int]
    dag_id: Mapped[StrID]
    allow_producer_teams: Mapped[list[str] | None]
    allow_global_producers: Mapped[bool] = mapped_column(server_default=sa.true())
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __table_args__ = (
        PrimaryKeyConstraint("asset_id", "dag_id", name="dsar_pkey"),
        _cascade(["asset_id"], ["asset.id"], "dsar_asset_fkey"),
        _cascade(["dag_id"], ["dag.dag_id"], "dsar_dag_id_fkey"),
        Index("idx_dag_schedule_asset_reference_dag_id", "dag_id"),
    )


class AssetDagRunQueue(Base):
    """``asset_dag_run_queue``: one row per (asset, consumer DAG) awaiting a run (the 3.0-3.3 key)."""

    __tablename__ = "asset_dag_run_queue"

    asset_id: Mapped[int]
    target_dag_id: Mapped[StrID]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        PrimaryKeyConstraint("asset_id", "target_dag_id", name="assetdagrunqueue_pkey"),
        _cascade(["asset_id"], ["asset.id"], "adrq_asset_fkey"),
        _cascade(["target_dag_id"], ["dag.dag_id"], "adrq_dag_fkey"),
        Index("idx_asset_dag_run_queue_target_dag_id", "target_dag_id"),
    )


class AssetEvent(Base):
    """``asset_event``. No FK to ``asset``: events outlive their asset, as in Airflow."""

    __tablename__ = "asset_event"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    asset_id: Mapped[int]
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)
    source_task_id: Mapped[StrID | None]
    source_dag_id: Mapped[StrID | None]
    source_run_id: Mapped[StrID | None]
    source_map_index: Mapped[int | None] = mapped_column(server_default="-1")
    timestamp: Mapped[dt.datetime] = mapped_column(default=utcnow)
    partition_key: Mapped[StrID | None]

    __table_args__ = (
        Index("idx_asset_id_timestamp", "asset_id", "timestamp"),
        {"sqlite_autoincrement": True},
    )
