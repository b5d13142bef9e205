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
        expected[models.DagBundleModel.__table__] = {"name": dag_id}
        expected[models.DagModel.__table__] = {
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
        for table in (models.DagBundleModel.__table__, models.DagModel.__table__):
            _insert(conn, table, **expected[table])
        asset["id"] = asset_id = _insert(conn, models.AssetModel.__table__, **asset)
        alias["id"] = alias_id = _insert(conn, models.AssetAliasModel.__table__, **alias)
        event["asset_id"] = asset_id
        event["id"] = event_id = _insert(conn, models.AssetEvent.__table__, **event)
        expected |= {
            models.AssetModel.__table__: asset,
            models.AssetAliasModel.__table__: alias,
            models.AssetEvent.__table__: event,
            models.AssetActive.__table__: {"name": name, "uri": uri},
            models.alias_association_table: {"alias_id": alias_id, "asset_id": asset_id},
            models.asset_alias_asset_event_association_table: {"alias_id": alias_id, "event_id": event_id},
            models.DagScheduleAssetReference.__table__: {
                "asset_id": asset_id,
                "dag_id": dag_id,
                "allow_producer_teams": [key, HOSTILE_ID],
                "allow_global_producers": False,
                "created_at": WHEN,
                "updated_at": WHEN,
            },
            models.DagScheduleAssetNameReference.__table__: {
                "name": name,
                "dag_id": dag_id,
                "created_at": WHEN,
            },
            models.DagScheduleAssetUriReference.__table__: {"uri": uri, "dag_id": dag_id, "created_at": WHEN},
            models.DagScheduleAssetAliasReference.__table__: {
                "alias_id": alias_id,
                "dag_id": dag_id,
                "created_at": WHEN,
                "updated_at": WHEN,
            },
            models.AssetDagRunQueue.__table__: {
                "asset_id": asset_id,
                "target_dag_id": dag_id,
                "created_at": WHEN,
            },
        }
        for table, row in expected.items():
            if table not in (
                models.DagBundleModel.__table__,
                models.DagModel.__table__,
                models.AssetModel.__table__,
                models.AssetAliasModel.__table__,
                models.AssetEvent.__table__,
            ):
                _insert(conn, table, **row)

    # Every table of the schema is covered; a new table must be added here.
    assert {t.name for t in expected} == set(models.metadata.tables)
    with engine.connect() as conn:
        for table, row in expected.items():
            assert _rows(conn, table) == [row], table.name
        # Timestamps come back aware, in UTC, to the microsecond.
        created_at = conn.scalar(sa.select(models.AssetDagRunQueue.__table__.c.created_at))
        assert created_at.utcoffset() == dt.timedelta(0)
        assert created_at == WHEN
        assert created_at.microsecond == WHEN.microsecond


def test_ids_and_names_compare_exactly(engine):
    """Airflow's collations: ids are byte-compared, asset names case-sensitive."""
    ids = ["dag", "Dag", "DAG", "dág", "dag_", "dag%"]
    names = ["asset", "Asset", "ASSET", "ásset"]
    with engine.begin() as conn:
        _insert(conn, models.DagBundleModel.__table__, name="b")
        conn.execute(
            sa.insert(models.DagModel.__table__),
            [{"dag_id": i, "is_paused": False, "bundle_name": "b"} for i in ids],
        )
        conn.execute(sa.insert(models.AssetModel.__table__), [{"name": n, "uri": n} for n in names])
    with engine.connect() as conn:
        assert sorted(conn.scalars(sa.select(models.DagModel.dag_id))) == sorted(ids)
        assert conn.scalar(sa.select(models.DagModel.dag_id).where(models.DagModel.dag_id == "dag")) == "dag"
        assert sorted(conn.scalars(sa.select(models.AssetModel.name))) == sorted(names)


@pytest.mark.backends("postgresql", "mysql")
def test_values_longer_than_the_column_are_rejected(engine):
    # SQLite does not enforce VARCHAR lengths; the servers must not truncate
    # (MySQL/MariaDB only in strict mode, their default).
    with engine.begin() as conn:
        _insert(conn, models.DagBundleModel.__table__, name="b")
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        _insert(
            conn,
            models.DagModel.__table__,
            dag_id="d" * (models.ID_LEN + 1),
            is_paused=False,
            bundle_name="b",
        )
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        _insert(conn, models.AssetModel.__table__, name="n" * 1501, uri="u")
    with engine.connect() as conn:
        assert _rows(conn, models.DagModel.__table__) == []
        assert _rows(conn, models.AssetModel.__table__) == []


# --- ON DELETE CASCADE, as in Airflow -----------------------------------------


def _graph(conn):
    """Two DAGs, two assets, one alias, scheduled on each other every possible way.

    Returns each row's primary key by name (a DAG's is its name).
    """
    _insert(conn, models.DagBundleModel.__table__, name="bundle")
    ids = {}
    for dag_id in ("d1", "d2"):
        ids[dag_id] = _insert(
            conn, models.DagModel.__table__, dag_id=dag_id, is_paused=False, bundle_name="bundle"
        )
    for n in ("a1", "a2"):
        ids[n] = _insert(conn, models.AssetModel.__table__, name=n, uri=f"s3://{n}")
        _insert(conn, models.AssetActive.__table__, name=n, uri=f"s3://{n}")
    ids["alias"] = _insert(conn, models.AssetAliasModel.__table__, name="alias")
    for n in ("a1", "a2"):
        ids[f"e_{n}"] = _insert(conn, models.AssetEvent.__table__, asset_id=ids[n])
        _insert(conn, models.alias_association_table, alias_id=ids["alias"], asset_id=ids[n])
        _insert(
            conn,
            models.asset_alias_asset_event_association_table,
            alias_id=ids["alias"],
            event_id=ids[f"e_{n}"],
        )
    for dag_id in ("d1", "d2"):
        for n in ("a1", "a2"):
            _insert(conn, models.DagScheduleAssetReference.__table__, asset_id=ids[n], dag_id=dag_id)
            _insert(conn, models.AssetDagRunQueue.__table__, asset_id=ids[n], target_dag_id=dag_id)
            _insert(conn, models.DagScheduleAssetNameReference.__table__, name=n, dag_id=dag_id)
            _insert(conn, models.DagScheduleAssetUriReference.__table__, uri=f"s3://{n}", dag_id=dag_id)
        _insert(conn, models.DagScheduleAssetAliasReference.__table__, alias_id=ids["alias"], dag_id=dag_id)
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


def _halved(*tables):
    """FULL with half the rows of ``tables``: the graph has two of every DAG, asset and event,
    so deleting one of them takes half the rows of each table that refers to it."""
    return FULL | {t: FULL[t] // 2 for t in tables}


def _delete_from_graph(engine, key_column, name):
    """Build :func:`_graph`, delete the row whose ``key_column`` is ``name``'s key, and let
    the foreign keys cascade; returns the graph's keys and every table's row count after."""
    with engine.begin() as conn:
        ids = _graph(conn)
        assert _counts(conn) == FULL
        conn.execute(sa.delete(key_column.table).where(key_column == ids[name]))
    with engine.connect() as conn:
        return ids, _counts(conn)


def test_deleting_a_dag_removes_its_queue_and_reference_rows(engine):
    _, counts = _delete_from_graph(engine, models.DagModel.dag_id, "d1")
    assert counts == _halved(
        "dag",
        "dag_schedule_asset_reference",
        "asset_dag_run_queue",
        "dag_schedule_asset_name_reference",
        "dag_schedule_asset_uri_reference",
        "dag_schedule_asset_alias_reference",
    )
    with engine.connect() as conn:
        assert set(conn.scalars(sa.select(models.AssetDagRunQueue.target_dag_id))) == {"d2"}


def test_deleting_an_asset_keeps_its_events(engine):
    ids, counts = _delete_from_graph(engine, models.AssetModel.id, "a1")
    assert counts == _halved(
        "asset", "asset_active", "asset_alias_asset", "dag_schedule_asset_reference", "asset_dag_run_queue"
    )
    # Name/URI references are by value, not by FK: they stay too.
    assert counts["dag_schedule_asset_name_reference"] == 4
    with engine.connect() as conn:
        assert set(conn.scalars(sa.select(models.AssetDagRunQueue.asset_id))) == {ids["a2"]}
        # asset_event has no FK to asset: history outlives the asset.
        assert set(conn.scalars(sa.select(models.AssetEvent.asset_id))) == {ids["a1"], ids["a2"]}


def test_deleting_an_alias_removes_its_associations(engine):
    _, counts = _delete_from_graph(engine, models.AssetAliasModel.id, "alias")
    # The graph's only alias: every row that refers to it goes with it.
    gone = (
        "asset_alias",
        "asset_alias_asset",
        "asset_alias_asset_event",
        "dag_schedule_asset_alias_reference",
    )
    assert counts == FULL | dict.fromkeys(gone, 0)


def test_deleting_an_event_removes_its_alias_association(engine):
    _, counts = _delete_from_graph(engine, models.AssetEvent.id, "e_a1")
    assert counts == _halved("asset_event", "asset_alias_asset_event")


def test_queue_rows_need_an_existing_dag_and_asset(engine):
    # SQLite enforces this only with PRAGMA foreign_keys=ON (set by create_engine).
    with engine.begin() as conn:
        ids = _graph(conn)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _insert(conn, models.AssetDagRunQueue.__table__, asset_id=ids["a1"], target_dag_id="no such dag")
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _insert(conn, models.AssetDagRunQueue.__table__, asset_id=-1, target_dag_id="d1")
    with engine.connect() as conn:
        assert _count(conn, models.AssetDagRunQueue.__table__) == 4


# --- timestamps --------------------------------------------------------------


def test_naive_datetime_is_rejected_before_anything_is_written(engine):
    with engine.begin() as conn:
        ids = _graph(conn)
        conn.execute(sa.delete(models.AssetDagRunQueue.__table__))
    naive = dt.datetime(2024, 1, 1, 12, 0)
    with pytest.raises(sa.exc.StatementError, match="naive datetime is disallowed"), engine.begin() as conn:
        _insert(
            conn, models.AssetDagRunQueue.__table__, asset_id=ids["a1"], target_dag_id="d1", created_at=naive
        )
    with engine.connect() as conn:
        assert _count(conn, models.AssetDagRunQueue.__table__) == 0


def test_default_timestamps_are_aware_utc_now(engine):
    before = models.utcnow()
    with engine.begin() as conn:
        _graph(conn)
    after = models.utcnow()
    with engine.connect() as conn:
        stamps = list(conn.scalars(sa.select(models.AssetDagRunQueue.created_at)))
        stamps += conn.scalars(sa.select(models.AssetEvent.timestamp))
    assert len(stamps) == 6
    for stamp in stamps:
        assert stamp.tzinfo is not None and stamp.utcoffset() == dt.timedelta(0)
        assert before - dt.timedelta(seconds=1) <= stamp <= after + dt.timedelta(seconds=1)
