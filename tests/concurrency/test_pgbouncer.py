"""Through PgBouncer in transaction pooling mode (the Helm chart's default in front of Airflow).

A client holds a server connection only for one transaction, so nothing may
depend on session state. The concurrency proof runs through a throwaway
PgBouncer: the set-based path stays deadlock-free with exact rows, the same
harness still catches Airflow 3.3.2's deadlocks, and the library works over
PgBouncer with both PostgreSQL drivers (psycopg 3 with its automatic
server-side prepared statements switched off, as PgBouncer < 1.21 requires).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, register_asset_change
from tests.concurrency.concurrency_harness import run_producers
from tests.factories import add_asset, add_dags, asset_ref, events, queued, schedule_on_asset

pytestmark = [pytest.mark.backends("postgresql"), pytest.mark.slow]


def test_connections_really_go_through_pgbouncer(pgbouncer_db_url, db_url):
    assert sa.make_url(pgbouncer_db_url).port != sa.make_url(db_url).port
    eng = sa.create_engine(pgbouncer_db_url)
    try:
        with eng.connect() as conn:
            # Two transactions of one client connection may run on different
            # server backends: session state does not carry over.
            conn.exec_driver_sql("SET application_name = 'adrq-session-state'")
            conn.commit()
            names = conn.exec_driver_sql("SHOW application_name").scalar()
        assert sa.make_url(pgbouncer_db_url).database == sa.make_url(db_url).database
        assert isinstance(names, str)
    finally:
        eng.dispose()


def test_set_based_path_never_deadlocks_through_pgbouncer(pgbouncer_db_url):
    outcome = run_producers(pgbouncer_db_url, "commit_time", "multi_outlet", producers=6, waves=6)

    assert outcome.failure_counts == {}, outcome.failure_counts
    assert outcome.committed == 36
    assert outcome.rows_exact, outcome.checks


def test_same_harness_catches_stock_deadlocks_through_pgbouncer(pgbouncer_db_url):
    outcome = run_producers(
        pgbouncer_db_url, "airflow_3_3", "single", producers=6, waves=30, stop_on_deadlock=True
    )

    assert outcome.deadlocks > 0, f"no deadlock in {len(outcome.results)} transactions"
    assert outcome.rows_exact, outcome.checks


@pytest.mark.parametrize(
    ("driver", "connect_args"),
    [("psycopg2", {}), ("psycopg", {"prepare_threshold": None})],
    ids=["psycopg2", "psycopg3-no-prepare"],
)
def test_register_through_pgbouncer_with_each_driver(pgbouncer_db_url, engine, driver, connect_args):
    with Session(engine) as s:
        add_dags(s, ["c1", "c2"])
        schedule_on_asset(s, add_asset(s, "a"), ["c1", "c2"])
        s.commit()
    url = sa.make_url(pgbouncer_db_url).set(drivername=f"postgresql+{driver}")
    eng = create_engine(url, connect_args=connect_args)
    try:
        # More transactions than psycopg 3's default prepare threshold (5).
        for _ in range(8):
            with Session(eng) as session:
                register_asset_change(asset=asset_ref("a"), session=session)
                session.commit()
    finally:
        eng.dispose()
    assert len(events(engine)) == 8
    assert len(queued(engine)) == 2
