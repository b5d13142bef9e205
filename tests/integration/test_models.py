# mypy: ignore-errors
"""The models behave like Airflow's tables on every backend.

Round trips of every column with hostile values (within each column's MySQL
charset: ids are utf8mb3, asset names/URIs latin1), values at the column
length, Airflow's ON DELETE CASCADE graph, and UTC-aware timestamps.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from airflow_adrq import models
from airflow_adrq.models import (
    AssetActive,
    AssetAliasModel,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagBundleModel,
    DagModel,
    DagScheduleAssetAliasReference,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
    alias_association_table,
    asset_alias_asset_event_association_table,
)

# Quotes of every SQL dialect, escapes, LIKE wildcards, comment and statement
# separators, control characters and non-ASCII text.
_NASTY = 'it\'s "dq" `bq` [sq] \\ ; -- /* %_ \t\n'
HOSTILE_ID = _NASTY + " ünï 中文 Ω"  # utf8mb3 (BMP) on MySQL: no 4-byte characters
HOSTILE_LATIN1 = _NASTY + " é ß ÿ © ½"  # latin1 on MySQL
# JSON columns are utf8mb4 text (or JSON) everywhere, so 4-byte characters are fine.
HOSTILE_JSON = {"k'ey": [_NASTY, "🚀 \U0001f600", None, 1.5, True], "nested": {"": ""}}

# Aware but not UTC, with microseconds: must come back as the same instant in UTC.
WHEN = dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))


def _values(kind: str) -> dict:
    if kind == "hostile":
        ids = [f"{HOSTILE_ID} {n}" for n in range(3)]
        strings = [f"{HOSTILE_LATIN1} {n}" for n in range(3)]
    else:
        # Exactly the column lengths (characters, not bytes): 250 for ids,
        # 1500 for asset strings. Multi-byte where the charset allows it.
        ids = [(str(n) + "中" * models.ID_LEN)[: models.ID_LEN] for n in range(3)]
        strings = [(str(n) + "é" * 1500)[:1500] for n in range(3)]
    return {"ids": ids, "strings": strings}


def _insert(conn, table, **values):
    return conn.execute(sa.insert(table).values(**values)).inserted_primary_key[0]


def _rows(conn, table):
    return [dict(row._mapping) for row in conn.execute(sa.select(table))]


@pytest.mark.parametrize("kind", ["hostile", "at-column-length"])
def test_every_table_round_trips(engine, kind):
    v = _values(kind)
    dag_id, run_id, key = v["ids"]
    name, uri, group = v["strings"]
    expected = {}
    with engine.begin() as conn:
        expected[DagBundleModel.__table__] = {"name": dag_id}
        expected[DagModel.__table__] = {
            "dag_id": dag_id,
            "is_paused": False,
            "is_stale": False,
            "exceeds_max_non_backfill": True,
            "bundle_name": dag_id,
            "has_import_errors": True,
            "timetable_partitioned": True,
            "asset_expression": HOSTILE_JSON,
            "max_active_runs": 7,
            "next_dagrun_create_after": WHEN,
        }
        asset = {"name": name, "uri": uri, "group": group, "extra": HOSTILE_JSON}
        asset |= {"created_at": WHEN, "updated_at": WHEN}
        alias = {"name": name, "group": group}
        event = {
            "extra": HOSTILE_JSON,
            "source_task_id": key,
            "source_dag_id": dag_id,
            "source_run_id": run_id,
            "source_map_index": 3,
            "timestamp": WHEN,
            "partition_key": key,
        }
        for table in (DagBundleModel.__table__, DagModel.__table__):
            _insert(conn, table, **expected[table])
        asset["id"] = asset_id = _insert(conn, AssetModel.__table__, **asset)
        alias["id"] = alias_id = _insert(conn, AssetAliasModel.__table__, **alias)
        event["asset_id"] = asset_id
        event["id"] = event_id = _insert(conn, AssetEvent.__table__, **event)
        expected |= {
            AssetModel.__table__: asset,
            AssetAliasModel.__table__: alias,
            AssetEvent.__table__: event,
            AssetActive.__table__: {"name": name, "uri": uri},
            alias_association_table: {"alias_id": alias_id, "asset_id": asset_id},
            asset_alias_asset_event_association_table: {"alias_id": alias_id, "event_id": event_id},
            DagScheduleAssetReference.__table__: {
                "asset_id": asset_id,
                "dag_id": dag_id,
                "allow_producer_teams": [key, HOSTILE_ID],
                "allow_global_producers": False,
                "created_at": WHEN,
                "updated_at": WHEN,
            },
            DagScheduleAssetNameReference.__table__: {"name": name, "dag_id": dag_id, "created_at": WHEN},
            DagScheduleAssetUriReference.__table__: {"uri": uri, "dag_id": dag_id, "created_at": WHEN},
            DagScheduleAssetAliasReference.__table__: {
                "alias_id": alias_id,
                "dag_id": dag_id,
                "created_at": WHEN,
                "updated_at": WHEN,
            },
            AssetDagRunQueue.__table__: {"asset_id": asset_id, "target_dag_id": dag_id, "created_at": WHEN},
        }
        for table, row in expected.items():
            if table not in (
                DagBundleModel.__table__,
                DagModel.__table__,
                AssetModel.__table__,
                AssetAliasModel.__table__,
                AssetEvent.__table__,
            ):
                _insert(conn, table, **row)

    # Every table of the schema is covered; a new table must be added here.
    assert {t.name for t in expected} == set(models.metadata.tables)
    with engine.connect() as conn:
        for table, row in expected.items():
            assert _rows(conn, table) == [row], table.name
        # Timestamps come back aware, in UTC, to the microsecond.
        created_at = conn.scalar(sa.select(AssetDagRunQueue.__table__.c.created_at))
        assert created_at.utcoffset() == dt.timedelta(0)
        assert created_at == WHEN
        assert created_at.microsecond == WHEN.microsecond


def test_ids_and_names_compare_exactly(engine):
    """Airflow's collations: ids are byte-compared, asset names case-sensitive."""
    ids = ["dag", "Dag", "DAG", "dág", "dag_", "dag%"]
    names = ["asset", "Asset", "ASSET", "ásset"]
    with engine.begin() as conn:
        _insert(conn, DagBundleModel.__table__, name="b")
        conn.execute(
            sa.insert(DagModel.__table__),
            [{"dag_id": i, "is_paused": False, "bundle_name": "b"} for i in ids],
        )
        conn.execute(sa.insert(AssetModel.__table__), [{"name": n, "uri": n} for n in names])
    with engine.connect() as conn:
        assert sorted(conn.scalars(sa.select(DagModel.dag_id))) == sorted(ids)
        assert conn.scalar(sa.select(DagModel.dag_id).where(DagModel.dag_id == "dag")) == "dag"
        assert sorted(conn.scalars(sa.select(AssetModel.name))) == sorted(names)


@pytest.mark.backends("postgresql", "mysql")
def test_values_longer_than_the_column_are_rejected(engine):
    # SQLite does not enforce VARCHAR lengths; the servers must not truncate
    # (MySQL/MariaDB only in strict mode, their default).
    with engine.begin() as conn:
        _insert(conn, DagBundleModel.__table__, name="b")
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        _insert(conn, DagModel.__table__, dag_id="d" * (models.ID_LEN + 1), is_paused=False, bundle_name="b")
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        _insert(conn, AssetModel.__table__, name="n" * 1501, uri="u")
    with engine.connect() as conn:
        assert _rows(conn, DagModel.__table__) == []
        assert _rows(conn, AssetModel.__table__) == []


# --- ON DELETE CASCADE, as in Airflow -----------------------------------------


def _graph(conn):
    """Two DAGs, two assets, one alias, scheduled on each other every possible way."""
    _insert(conn, DagBundleModel.__table__, name="bundle")
    for dag_id in ("d1", "d2"):
        _insert(conn, DagModel.__table__, dag_id=dag_id, is_paused=False, bundle_name="bundle")
    ids = {}
    for n in ("a1", "a2"):
        ids[n] = _insert(conn, AssetModel.__table__, name=n, uri=f"s3://{n}")
        _insert(conn, AssetActive.__table__, name=n, uri=f"s3://{n}")
    ids["alias"] = _insert(conn, AssetAliasModel.__table__, name="alias")
    for n in ("a1", "a2"):
        ids[f"e_{n}"] = _insert(conn, AssetEvent.__table__, asset_id=ids[n])
        _insert(conn, alias_association_table, alias_id=ids["alias"], asset_id=ids[n])
        _insert(
            conn, asset_alias_asset_event_association_table, alias_id=ids["alias"], event_id=ids[f"e_{n}"]
        )
    for dag_id in ("d1", "d2"):
        for n in ("a1", "a2"):
            _insert(conn, DagScheduleAssetReference.__table__, asset_id=ids[n], dag_id=dag_id)
            _insert(conn, AssetDagRunQueue.__table__, asset_id=ids[n], target_dag_id=dag_id)
            _insert(conn, DagScheduleAssetNameReference.__table__, name=n, dag_id=dag_id)
            _insert(conn, DagScheduleAssetUriReference.__table__, uri=f"s3://{n}", dag_id=dag_id)
        _insert(conn, DagScheduleAssetAliasReference.__table__, alias_id=ids["alias"], dag_id=dag_id)
    return ids


def _count(conn, table):
    return conn.scalar(sa.select(sa.func.count()).select_from(table))


def _counts(conn):
    return {name: _count(conn, table) for name, table in models.metadata.tables.items()}


FULL = {
    "dag_bundle": 1,
    "dag": 2,
    "asset": 2,
    "asset_active": 2,
    "asset_alias": 1,
    "asset_alias_asset": 2,
    "asset_event": 2,
    "asset_alias_asset_event": 2,
    "dag_schedule_asset_reference": 4,
    "asset_dag_run_queue": 4,
    "dag_schedule_asset_name_reference": 4,
    "dag_schedule_asset_uri_reference": 4,
    "dag_schedule_asset_alias_reference": 2,
}


def test_deleting_a_dag_removes_its_queue_and_reference_rows(engine):
    with engine.begin() as conn:
        _graph(conn)
        assert _counts(conn) == FULL
        conn.execute(sa.delete(DagModel.__table__).where(DagModel.dag_id == "d1"))
    with engine.connect() as conn:
        assert _counts(conn) == FULL | {
            "dag": 1,
            "dag_schedule_asset_reference": 2,
            "asset_dag_run_queue": 2,
            "dag_schedule_asset_name_reference": 2,
            "dag_schedule_asset_uri_reference": 2,
            "dag_schedule_asset_alias_reference": 1,
        }
        assert set(conn.scalars(sa.select(AssetDagRunQueue.target_dag_id))) == {"d2"}


def test_deleting_an_asset_keeps_its_events(engine):
    with engine.begin() as conn:
        ids = _graph(conn)
        conn.execute(sa.delete(AssetModel.__table__).where(AssetModel.id == ids["a1"]))
    with engine.connect() as conn:
        assert _counts(conn) == FULL | {
            "asset": 1,
            "asset_active": 1,
            "asset_alias_asset": 1,
            "dag_schedule_asset_reference": 2,
            "asset_dag_run_queue": 2,
        }
        assert set(conn.scalars(sa.select(AssetDagRunQueue.asset_id))) == {ids["a2"]}
        # asset_event has no FK to asset: history outlives the asset.
        assert set(conn.scalars(sa.select(AssetEvent.asset_id))) == {ids["a1"], ids["a2"]}
        # Name/URI references are by value, not by FK: they stay too.
        assert _count(conn, DagScheduleAssetNameReference.__table__) == 4


def test_deleting_an_alias_removes_its_associations(engine):
    with engine.begin() as conn:
        ids = _graph(conn)
        conn.execute(sa.delete(AssetAliasModel.__table__).where(AssetAliasModel.id == ids["alias"]))
    with engine.connect() as conn:
        assert _counts(conn) == FULL | {
            "asset_alias": 0,
            "asset_alias_asset": 0,
            "asset_alias_asset_event": 0,
            "dag_schedule_asset_alias_reference": 0,
        }


def test_deleting_an_event_removes_its_alias_association(engine):
    with engine.begin() as conn:
        ids = _graph(conn)
        conn.execute(sa.delete(AssetEvent.__table__).where(AssetEvent.id == ids["e_a1"]))
    with engine.connect() as conn:
        assert _counts(conn) == FULL | {"asset_event": 1, "asset_alias_asset_event": 1}


def test_queue_rows_need_an_existing_dag_and_asset(engine):
    # SQLite enforces this only with PRAGMA foreign_keys=ON (set by create_engine).
    with engine.begin() as conn:
        ids = _graph(conn)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _insert(conn, AssetDagRunQueue.__table__, asset_id=ids["a1"], target_dag_id="no such dag")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _insert(conn, AssetDagRunQueue.__table__, asset_id=-1, target_dag_id="d1")
    with engine.connect() as conn:
        assert _count(conn, AssetDagRunQueue.__table__) == 4


# --- timestamps --------------------------------------------------------------


def test_naive_datetime_is_rejected_before_anything_is_written(engine):
    with engine.begin() as conn:
        ids = _graph(conn)
        conn.execute(sa.delete(AssetDagRunQueue.__table__))
    naive = dt.datetime(2024, 1, 1, 12, 0)
    with pytest.raises(sa.exc.StatementError, match="naive datetime is disallowed"), engine.begin() as conn:
        _insert(conn, AssetDagRunQueue.__table__, asset_id=ids["a1"], target_dag_id="d1", created_at=naive)
    with engine.connect() as conn:
        assert _count(conn, AssetDagRunQueue.__table__) == 0


def test_default_timestamps_are_aware_utc_now(engine):
    before = models.utcnow()
    with engine.begin() as conn:
        _graph(conn)
    after = models.utcnow()
    with engine.connect() as conn:
        stamps = list(conn.scalars(sa.select(AssetDagRunQueue.created_at)))
        stamps += conn.scalars(sa.select(AssetEvent.timestamp))
    assert len(stamps) == 6
    for stamp in stamps:
        assert stamp.tzinfo is not None and stamp.utcoffset() == dt.timedelta(0)
        assert before - dt.timedelta(seconds=1) <= stamp <= after + dt.timedelta(seconds=1)
