# mypy: ignore-errors
"""The queue statement as each dialect renders it (no database needed)."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

from airflow_adrq import build_queue_statement
from airflow_adrq.errors import UnsupportedDialectError

DIALECTS = {
    "postgresql": postgresql.dialect(),
    "mysql": mysql.dialect(),
    "mariadb": mysql.dialect(is_mariadb=True),
    "sqlite": sqlite.dialect(),
}
CONFLICT = {
    "postgresql": "ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
    "mysql": "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
    "mariadb": "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
    "sqlite": "ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
}
REFERENCES = (
    "dag_schedule_asset_reference",
    "dag_schedule_asset_name_reference",
    "dag_schedule_asset_uri_reference",
    "dag_schedule_asset_alias_reference",
)


def _sql(name, **kw):
    dialect = DIALECTS[name]
    compiled = build_queue_statement(dialect, **kw).compile(dialect=dialect)
    return " ".join(str(compiled).split()), compiled


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_one_ordered_insert_select_driven_by_events(name):
    sql, _ = _sql(name)
    assert "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at)" in sql
    assert (
        "WITH ev AS (SELECT asset_event.id AS event_id, asset_event.asset_id AS asset_id FROM asset_event"
        in sql
    )
    assert "asset_event.partition_key IS NULL" in sql
    assert "ORDER BY src.asset_id, src.dag_id" in sql
    # The ORDER BY is on the top-level SELECT (MariaDB ignores it in derived tables).
    assert sql.rindex("ORDER BY") > sql.rindex(") AS src")
    assert sql.endswith(CONFLICT[name])
    assert "IGNORE" not in sql.upper().replace("ON CONFLICT", "")
    for table in REFERENCES:
        assert table in sql
    # Aliases through the event's own alias links, not through names.
    assert "asset_alias_asset_event.event_id = ev.event_id" in sql
    assert "dag.is_paused = " in sql and "dag.timetable_partitioned = " in sql


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_shape_is_constant_and_the_ids_are_rendered_once(name):
    _, compiled = _sql(name)
    # One expanding parameter (the ids), in the CTE only, and the timestamp.
    assert set(compiled.params) == {"ids", "created_at"}
    assert str(compiled).count("POSTCOMPILE_ids") == 1
    # Built once per (dialect, source, conflict mode): the same object, so
    # SQLAlchemy's compiled cache serves every later execution.
    assert build_queue_statement(DIALECTS[name]) is build_queue_statement(DIALECTS[name])


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_asset_id_form_has_no_alias_branch(name):
    sql, compiled = _sql(name, source="assets")
    assert "asset_event" not in sql
    assert "dag_schedule_asset_alias_reference" not in sql
    assert set(compiled.params) == {"ids", "created_at"}
    assert sql.endswith(CONFLICT[name])


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_refresh_keeps_the_greatest_created_at(name):
    sql, _ = _sql(name, on_conflict="refresh")
    old, new = "asset_dag_run_queue.created_at", "excluded.created_at"
    odku = f"ON DUPLICATE KEY UPDATE created_at = greatest({old}, VALUES(created_at))"
    expected = {
        "postgresql": f"DO UPDATE SET created_at = greatest({old}, {new}) WHERE {old} < {new}",
        "mysql": odku,
        "mariadb": odku,
        "sqlite": f"DO UPDATE SET created_at = max({old}, {new}) WHERE {old} < {new}",
    }[name]
    assert sql.endswith(expected)


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_conflict"):
        build_queue_statement(DIALECTS["sqlite"], on_conflict="replace")
    with pytest.raises(ValueError, match="source"):
        build_queue_statement(DIALECTS["sqlite"], source="dags")
    with pytest.raises(UnsupportedDialectError, match="oracle"):
        build_queue_statement("oracle")


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_airflow_3_0_shape_has_no_partition_columns(name):
    from airflow_adrq.shapes import AIRFLOW_3_0

    sql, _ = _sql(name, shape=AIRFLOW_3_0)
    assert "partition_key" not in sql and "timetable_partitioned" not in sql and "is_draining" not in sql
    assert "dag.is_paused = " in sql and sql.endswith(CONFLICT[name])


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_airflow_3_4_shape_writes_one_row_per_event_in_key_order(name):
    from airflow_adrq.shapes import AIRFLOW_3_4

    sql, compiled = _sql(name, shape=AIRFLOW_3_4)
    assert "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, asset_event_id, created_at)" in sql
    assert "dag.is_draining = " in sql and "dag.timetable_partitioned = " in sql
    assert sql.rindex("ORDER BY src.dag_id, src.event_id") > sql.rindex(") AS src")
    if name in ("postgresql", "sqlite"):
        assert sql.endswith("ON CONFLICT (target_dag_id, asset_event_id) DO NOTHING")
    assert set(compiled.params) == {"ids", "created_at"}
    with pytest.raises(ValueError, match="keyed by event"):
        build_queue_statement(DIALECTS[name], source="assets", shape=AIRFLOW_3_4)
