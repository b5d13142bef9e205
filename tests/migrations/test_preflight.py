"""A half-built database: refused before any DDL, and a failed upgrade leaves nothing behind."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq import migrate
from airflow_adrq.errors import AdrqError
from airflow_adrq.models import metadata


def _tables(url):
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_existing_table_is_refused_before_any_ddl(fresh_db_url):
    engine = sa.create_engine(fresh_db_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dag (dag_id VARCHAR(250) PRIMARY KEY)")
    engine.dispose()

    with pytest.raises(AdrqError, match=r"already has the table\(s\) dag that airflow-adrq would create"):
        migrate.upgrade(fresh_db_url)
    # Nothing else was created: no version table, no dag_bundle.
    assert _tables(fresh_db_url) == {"dag"}


def test_a_failed_upgrade_leaves_the_database_as_it_was_and_can_be_rerun(fresh_db_url, monkeypatch):
    # Fail half-way, after some CREATE TABLEs went through (on MySQL/MariaDB
    # each of those has committed by then).
    original = migrate.command.upgrade
    created_first = []

    def failing_upgrade(config, revision):
        connection = config.attributes["connection"]

        def boom(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("CREATE TABLE"):
                created_first.append(statement.split()[2])
            if statement.lstrip().upper().startswith("CREATE TABLE ASSET_EVENT"):
                raise RuntimeError("simulated failure half-way through the upgrade")

        sa.event.listen(connection.engine, "before_cursor_execute", boom)
        try:
            original(config, revision)
        finally:
            sa.event.remove(connection.engine, "before_cursor_execute", boom)

    monkeypatch.setattr(migrate.command, "upgrade", failing_upgrade)
    with pytest.raises(AdrqError, match="left as it was found") as caught:
        migrate.upgrade(fresh_db_url)
    assert "simulated failure" in str(caught.value)
    assert len(created_first) > 3, created_first  # it really failed half-way
    assert _tables(fresh_db_url) == set()

    monkeypatch.setattr(migrate.command, "upgrade", original)
    result = migrate.upgrade(fresh_db_url)
    assert set(result.tables_created) >= set(metadata.tables)
    assert migrate.current(fresh_db_url) == migrate.heads()[0]
