"""The columns the queueing SQL reads and writes, as SQLAlchemy Core tables.

What the plug-in imports in every Airflow process: Airflow's tables with only
the columns the statements name (no keys beyond the primary key, no indexes, no
ORM class); the full, Airflow-identical DDL is :mod:`airflow_adrq.models`. A
metadata of their own: ``schema_translate_map`` (``[database]
sql_alchemy_schema``) rewrites these tables wherever they appear.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = [
    "MYSQL_FAMILY",
    "UtcDateTime",
    "asset",
    "asset_alias",
    "asset_alias_asset",
    "asset_alias_asset_event",
    "asset_dag_run_queue",
    "asset_dag_run_queue_by_event",
    "asset_event",
    "dag",
    "dag_schedule_asset_alias_reference",
    "dag_schedule_asset_name_reference",
    "dag_schedule_asset_reference",
    "dag_schedule_asset_uri_reference",
    "utcnow",
]

#: SQLAlchemy's names of the MySQL family (column types differ there).
MYSQL_FAMILY = ("mysql", "mariadb")


def utcnow() -> dt.datetime:
    """Timezone-aware now in UTC (Airflow's ``timezone.utcnow``)."""
    return dt.datetime.now(dt.timezone.utc)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Airflow's ``UtcDateTime``: ``TIMESTAMP WITH TIME ZONE``, UTC in and out.

    Naive datetimes are rejected. MySQL's TIMESTAMP has no time zone, so values
    are sent as naive UTC there (as Airflow does) and read back as aware UTC.
    """

    impl = sa.TIMESTAMP(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in MYSQL_FAMILY:
            return dialect.type_descriptor(mysql.TIMESTAMP(fsp=6))
        # As Airflow: the TIMESTAMP impl itself, so SQLite's DDL says
        # TIMESTAMP (dialect.type_descriptor would adapt it to DATETIME).
        return super().load_dialect_impl(dialect)

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise TypeError(f"expected datetime.datetime, not {value!r}")
        if value.tzinfo is None:
            raise ValueError("naive datetime is disallowed")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name in MYSQL_FAMILY else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


metadata = MetaData()


def _id() -> Column[int]:
    return Column("id", Integer, primary_key=True)


dag = Table(
    "dag",
    metadata,
    Column("dag_id", String, primary_key=True),
    Column("is_paused", Boolean),
    Column("timetable_partitioned", Boolean),  # 3.2+
    Column("is_draining", Boolean),  # 3.4
)
asset = Table("asset", metadata, _id(), Column("name", String), Column("uri", String))
asset_event = Table(
    "asset_event",
    metadata,
    _id(),
    Column("asset_id", Integer),
    Column("timestamp", UtcDateTime()),
    Column("partition_key", String),  # 3.2+
)
#: Airflow 3.0-3.3's queue: one row per (asset, consumer DAG).
asset_dag_run_queue = Table(
    "asset_dag_run_queue",
    metadata,
    Column("asset_id", Integer, primary_key=True),
    Column("target_dag_id", String, primary_key=True),
    Column("created_at", UtcDateTime()),
)
#: Airflow 3.4's queue: one row per (consumer DAG, event). Same name, so a metadata of its own.
asset_dag_run_queue_by_event = Table(
    "asset_dag_run_queue",
    MetaData(),
    Column("target_dag_id", String, primary_key=True),
    Column("asset_event_id", Integer, primary_key=True),
    Column("asset_id", Integer),
    Column("created_at", UtcDateTime()),
)


def _pair(name: str, first: str, first_type: Any, second: str = "dag_id", second_type: Any = String) -> Table:
    """A table keyed by two columns (a reference or a link) and holding nothing else the SQL reads."""
    first_column = Column(first, first_type, primary_key=True)
    return Table(name, metadata, first_column, Column(second, second_type, primary_key=True))


dag_schedule_asset_reference = _pair("dag_schedule_asset_reference", "asset_id", Integer)
dag_schedule_asset_name_reference = _pair("dag_schedule_asset_name_reference", "name", String)
dag_schedule_asset_uri_reference = _pair("dag_schedule_asset_uri_reference", "uri", String)
dag_schedule_asset_alias_reference = _pair("dag_schedule_asset_alias_reference", "alias_id", Integer)
asset_alias = Table("asset_alias", metadata, _id(), Column("name", String), Column("group", String))
asset_alias_asset = _pair("asset_alias_asset", "alias_id", Integer, "asset_id", Integer)
asset_alias_asset_event = _pair("asset_alias_asset_event", "alias_id", Integer, "event_id", Integer)
