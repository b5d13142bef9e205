"""The raw-SQL reference of the ratio row writes what the library writes for one event."""

from __future__ import annotations

import sqlalchemy as sa

from airflow_adrq.models import AssetDagRunQueue, AssetEvent
from airflow_adrq_bench import rawsql
from airflow_adrq_testing import dataset


def test_raw_sql_reference_writes_the_library_rows(backend, db_url):
    engine = dataset.bench_engine(db_url, lock_timeout_s=5)
    try:
        (asset,) = dataset.seed_fan(engine, "raw", outlets=1, fanout=3)
        with engine.connect() as conn:
            consumers = dataset.consumer_dags(conn, [asset.id])[asset.id]
        connection = engine.raw_connection()
        try:
            raw = rawsql.raw_sql(engine.dialect)
            source = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1}
            event_id = raw.register(connection, name=asset.name, uri=asset.uri, source=source)
        finally:
            connection.close()
        with engine.connect() as conn:
            rows = conn.execute(sa.select(AssetDagRunQueue.target_dag_id, AssetDagRunQueue.created_at)).all()
            stamp = conn.execute(
                sa.select(AssetEvent.timestamp).where(AssetEvent.id == event_id)
            ).scalar_one()
    finally:
        engine.dispose()
    assert {d for d, _ in rows} == consumers and len(consumers) == 3
    # The event and its queue rows carry the same stamp, as the library's commit mode.
    assert {c for _, c in rows} == {stamp}
