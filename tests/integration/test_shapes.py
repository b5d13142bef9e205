"""Reading an Airflow schema's shape off the catalog, and writing each shape's queue."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import defer_events, shapes
from airflow_adrq.doctor.compatibility import detect
from airflow_adrq.errors import UnsupportedSchemaError
from tests.factories import add_asset, add_dags, schedule_on_asset


def test_the_librarys_tables_are_the_3_3_shape(engine):
    with engine.connect() as conn:
        assert detect(conn) == shapes.PARTITIONED


def _reshape(engine, backend, *, drop_partitions=False, event_keyed=False):
    """Turn the library's 3.3 tables into another release's shape, as that release's migrations would."""
    with engine.begin() as conn:
        if drop_partitions:
            for table, col in (("dag", "timetable_partitioned"), ("asset_event", "partition_key")):
                conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {col}")
        if event_keyed:
            conn.exec_driver_sql("DROP TABLE asset_dag_run_queue")
            conn.exec_driver_sql(
                "CREATE TABLE asset_dag_run_queue (target_dag_id VARCHAR(250) NOT NULL, "
                "asset_event_id INTEGER NOT NULL, asset_id INTEGER NOT NULL, created_at TIMESTAMP NOT NULL, "
                "PRIMARY KEY (target_dag_id, asset_event_id))"
            )
            conn.exec_driver_sql("ALTER TABLE dag ADD COLUMN is_draining BOOLEAN NOT NULL DEFAULT false")


@pytest.mark.backends("postgresql", "mysql")
@pytest.mark.parametrize("target", ["3.0", "3.4"])
def test_detect_and_write_other_release_shapes(fresh_db_url, backend, target):
    from airflow_adrq import create_engine
    from airflow_adrq.models import metadata

    engine = create_engine(fresh_db_url)
    try:
        metadata.create_all(engine)
        with Session(engine) as s:
            add_dags(s, ["c1", "c2", "paused"], paused={"paused"})
            asset_id = add_asset(s, "a")
            schedule_on_asset(s, asset_id, ["c1", "c2", "paused"])
            s.commit()
        _reshape(engine, backend, drop_partitions=target == "3.0", event_keyed=target == "3.4")
        expected = {"3.0": shapes.UNPARTITIONED, "3.4": shapes.EVENT_KEYED}[target]
        with engine.connect() as conn:
            assert detect(conn) == expected
        event_table = sa.table("asset_event", sa.column("id"), sa.column("asset_id"))
        ids = []
        for _ in range(2):
            with Session(engine) as session:
                conn = session.connection()
                conn.execute(
                    sa.text("INSERT INTO asset_event (asset_id, extra, timestamp) VALUES (:a, '{}', :t)"),
                    {"a": asset_id, "t": dt.datetime(2026, 1, 1)},
                )
                (event_id,) = conn.execute(sa.select(sa.func.max(event_table.c.id))).one()
                ids.append(event_id)
                defer_events(
                    session, [type("E", (), {"id": event_id, "asset_id": asset_id})()], shape=expected
                )
                session.commit()
        with engine.connect() as conn:
            if target == "3.4":
                rows = set(
                    conn.execute(sa.text("SELECT target_dag_id, asset_event_id FROM asset_dag_run_queue"))
                )
                assert rows == {(d, e) for d in ("c1", "c2") for e in ids}  # one row per event
            else:
                rows = set(conn.execute(sa.text("SELECT asset_id, target_dag_id FROM asset_dag_run_queue")))
                assert rows == {(asset_id, "c1"), (asset_id, "c2")}
    finally:
        engine.dispose()


def test_unknown_shapes_are_refused(fresh_db_url):
    engine = sa.create_engine(fresh_db_url)
    try:
        with engine.connect() as conn, pytest.raises(UnsupportedSchemaError, match="no asset_dag_run_queue"):
            detect(conn)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE asset_dag_run_queue (x INTEGER PRIMARY KEY)")
        with engine.connect() as conn, pytest.raises(UnsupportedSchemaError, match=r"primary key \(x\)"):
            detect(conn)
    finally:
        engine.dispose()
