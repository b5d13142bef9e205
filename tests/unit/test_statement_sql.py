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
_OLD, _NEW = "asset_dag_run_queue.created_at", "excluded.created_at"
_ODKU_REFRESH = f"ON DUPLICATE KEY UPDATE created_at = greatest({_OLD}, VALUES(created_at))"
#: The default: an existing row's created_at moves forwards to the newest stamp.
CONFLICT = {
    "postgresql": "ON CONFLICT (asset_id, target_dag_id) DO UPDATE SET "
    f"created_at = greatest({_OLD}, {_NEW}) WHERE {_OLD} < {_NEW}",
    "mysql": _ODKU_REFRESH,
    "mariadb": _ODKU_REFRESH,
    "sqlite": f"ON CONFLICT (asset_id, target_dag_id) DO UPDATE SET created_at = max({_OLD}, {_NEW}) "
    f"WHERE {_OLD} < {_NEW}",
}
#: on_conflict="ignore": Airflow's DO NOTHING.
IGNORE = {
    "postgresql": "ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
    "mysql": "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
    "mariadb": "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
    "sqlite": "ON CONFLICT (asset_id, target_dag_id) DO NOTHING",
}
#: MySQL/MariaDB: the lock-free probe that skips the rows needing no write.
_PROBE = (
    "AND NOT (EXISTS (SELECT * FROM asset_dag_run_queue WHERE asset_dag_run_queue.asset_id = src.asset_id "
    "AND asset_dag_run_queue.target_dag_id = src.dag_id"
)
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


def test_what_postgresql_sends_binds_the_event_ids_only_to_read_and_to_stamp_them():
    from airflow_adrq import statement
    from airflow_adrq.dialects import postgresql

    dialect = DIALECTS["postgresql"]
    stmt = postgresql.one_statement(statement.Form("events", "refresh"))
    compiled = stmt.compile(dialect=dialect)
    sql = " ".join(str(compiled).split())
    # No per-DAG parameter: the ids, bound where the events are read (ev) and where they are stamped.
    assert set(compiled.params) == {"ids"}
    assert sql.count("POSTCOMPILE_ids") == 2
    assert "WITH ev AS (SELECT asset_event.id AS event_id" in sql
    stamped = (
        "WHERE asset_event.id IN (__[POSTCOMPILE_ids]) RETURNING asset_event.timestamp, (SELECT count(*)"
    )
    assert stamped in sql
    # The share locks in byte order, NOWAIT, then the clock (read after them), then the INSERT.
    locks = 'ORDER BY dag.dag_id COLLATE "C" FOR SHARE OF dag NOWAIT'
    assert sql.index(locks) < sql.index("clock_timestamp()")
    assert sql.index("clock_timestamp()") < sql.index("INSERT INTO asset_dag_run_queue")
    assert CONFLICT["postgresql"] in sql
    assert postgresql.one_statement(statement.Form("events", "refresh")) is stmt


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_shape_is_constant_and_the_bare_insert_binds_the_ids_once(name):
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
def test_ignore_is_airflows_do_nothing(name):
    sql, _ = _sql(name, on_conflict="ignore")
    assert sql.endswith(IGNORE[name])
    default = build_queue_statement(DIALECTS[name])
    assert default is build_queue_statement(DIALECTS[name], on_conflict="refresh")


@pytest.mark.parametrize("name", ["mysql", "mariadb"])
def test_mysql_skips_rows_needing_no_write_with_a_lock_free_probe(name):
    # InnoDB locks even a no-op ODKU's duplicate: the probe keeps existing rows
    # that need no write out of the INSERT (every one for "ignore", those at
    # least as new as the stamp for "refresh").
    ignore, _ = _sql(name, on_conflict="ignore")
    assert _PROBE + "))" in ignore
    refresh, _ = _sql(name, on_conflict="refresh")
    assert _PROBE + " AND asset_dag_run_queue.created_at >= %s))" in refresh
    # The probe is part of the top-level SELECT, before its ORDER BY.
    assert refresh.index(_PROBE) < refresh.rindex("ORDER BY src.asset_id, src.dag_id")


@pytest.mark.parametrize("name", ["postgresql", "sqlite"])
def test_on_conflict_dialects_have_no_probe(name):
    for mode in ("ignore", "refresh"):
        sql, _ = _sql(name, on_conflict=mode)
        assert "EXISTS" not in sql
        # No probe because the database resolves the conflict (a blank statement would pass the line above).
        assert "ON CONFLICT (asset_id, target_dag_id) DO" in sql


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_conflict"):
        build_queue_statement(DIALECTS["sqlite"], on_conflict="replace")
    with pytest.raises(ValueError, match="source"):
        build_queue_statement(DIALECTS["sqlite"], source="dags")
    with pytest.raises(UnsupportedDialectError, match="oracle"):
        build_queue_statement("oracle")


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_airflow_3_0_shape_has_no_partition_columns(name):
    from airflow_adrq.shapes import UNPARTITIONED

    sql, _ = _sql(name, shape=UNPARTITIONED)
    assert "partition_key" not in sql and "timetable_partitioned" not in sql and "is_draining" not in sql
    assert "dag.is_paused = " in sql and sql.endswith(CONFLICT[name])


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_airflow_3_4_shape_writes_one_row_per_event_in_key_order(name):
    from airflow_adrq.shapes import EVENT_KEYED

    sql, compiled = _sql(name, shape=EVENT_KEYED)
    assert "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, asset_event_id, created_at)" in sql
    assert "dag.is_draining = " in sql and "dag.timetable_partitioned = " in sql
    assert sql.rindex("ORDER BY src.dag_id, src.event_id") > sql.rindex(") AS src")
    if name in ("postgresql", "sqlite"):
        assert sql.endswith("ON CONFLICT (target_dag_id, asset_event_id) DO NOTHING")
    assert set(compiled.params) == {"ids", "created_at"}
    with pytest.raises(ValueError, match="keyed by event"):
        build_queue_statement(DIALECTS[name], source="assets", shape=EVENT_KEYED)
