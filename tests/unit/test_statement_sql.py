# mypy: ignore-errors
"""The queue statement as each dialect renders it (no database needed)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

from airflow_adrq import QueueTarget, build_queue_statement
from airflow_adrq.errors import UnsupportedDialectError

NOW = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)
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


def _sql(name, targets, **kw):
    dialect = DIALECTS[name]
    compiled = build_queue_statement(targets, dialect=dialect, created_at=NOW, **kw).compile(dialect=dialect)
    return " ".join(str(compiled).split()), compiled


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_one_ordered_insert_select_with_the_dialect_conflict_clause(name):
    sql, _ = _sql(name, [QueueTarget(3), QueueTarget(1, ("al",))])
    assert sql.startswith("INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) SELECT ")
    assert "ORDER BY src.asset_id, src.dag_id" in sql
    # The ORDER BY is on the top-level SELECT (MariaDB ignores it in derived tables).
    assert sql.rindex("ORDER BY") > sql.rindex(") AS src")
    assert sql.endswith(CONFLICT[name])
    assert "IGNORE" not in sql.upper().replace("ON CONFLICT", "")
    for table in (
        "dag_schedule_asset_reference",
        "dag_schedule_asset_name_reference",
        "dag_schedule_asset_uri_reference",
        "dag_schedule_asset_alias_reference",
    ):
        assert table in sql
    assert "dag.is_paused = " in sql and "dag.timetable_partitioned = " in sql


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_refresh_keeps_the_greatest_created_at(name):
    sql, _ = _sql(name, [1], on_conflict="refresh")
    old, new = "asset_dag_run_queue.created_at", "excluded.created_at"
    odku = f"ON DUPLICATE KEY UPDATE created_at = greatest({old}, VALUES(created_at))"
    expected = {
        "postgresql": f"DO UPDATE SET created_at = greatest({old}, {new}) WHERE {old} < {new}",
        "mysql": odku,
        "mariadb": odku,
        "sqlite": f"DO UPDATE SET created_at = max({old}, {new}) WHERE {old} < {new}",
    }[name]
    assert sql.endswith(expected)


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_parameters_are_per_asset_not_per_dag(name):
    _, compiled = _sql(name, [QueueTarget(i) for i in range(5)])
    # One expanding parameter for the asset ids and one for the timestamp.
    assert set(compiled.params) == {"asset_ids", "created_at"}
    assert compiled.params["asset_ids"] == [0, 1, 2, 3, 4]


def test_targets_are_merged_and_sorted():
    _, compiled = _sql("postgresql", [QueueTarget(5, ("b",)), 2, QueueTarget(5, ("a", "b"))])
    assert compiled.params["asset_ids"] == [2, 5]
    assert sorted(v for k, v in compiled.params.items() if k.startswith("name_")) == [["a", "b"]]


def test_bad_targets():
    with pytest.raises(ValueError, match="no targets"):
        build_queue_statement([], dialect=DIALECTS["sqlite"])
    with pytest.raises(TypeError):
        QueueTarget("1")
    with pytest.raises(TypeError):
        QueueTarget(1, "alias")
    with pytest.raises(ValueError, match="on_conflict"):
        build_queue_statement([1], dialect=DIALECTS["sqlite"], on_conflict="replace")
    with pytest.raises(UnsupportedDialectError, match="oracle"):
        build_queue_statement([1], dialect="oracle")
