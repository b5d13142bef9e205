"""The queue write reads ``dag`` by primary key, whatever fan-out the planner guesses (PostgreSQL).

The planner cannot know which assets the transaction's events are of, so it
estimates the consumers of an event from the average fan-out. With one
popular asset among many DAGs that average is high, and a join from the
consumers to ``dag`` was planned as a hash join over a sequential scan of
every DAG, twice per COMMIT (the share lock and the INSERT's filter): 3 ms
for an event with one consumer among 10,000 DAGs. The statement now reads
the consumers once and probes ``dag``'s primary key with ``= ANY(<array>)``.

The reverse: with many assets of one consumer each, the average is small,
and a popular asset's event has far more consumers than planned. A join of
the consumers to the locked rows (two CTEs, which have no statistics) was
then a nested loop over both: 1,024 consumers, a million comparisons. The
statement joins the consumers to ``dag`` itself, by its primary key.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import register_asset_change, statement
from airflow_adrq.dialects import postgresql
from tests.factories import asset_ref

pytestmark = pytest.mark.backends("postgresql")

DAGS = 3_000


def _plan(conn: Any, statement: Any, event_id: int) -> str:
    """``EXPLAIN`` of ``statement`` as the library sends it (compiled, parameters bound)."""

    def explain(_conn, _cursor, sql, parameters, _context, _executemany):
        return "EXPLAIN " + sql, parameters

    sa.event.listen(conn, "before_cursor_execute", explain, retval=True)
    try:
        result = conn.execute(statement, {"ids": [event_id]})
        # The driver's rows: the statement's result types do not fit EXPLAIN's text.
        return "\n".join(row[0] for row in result.cursor.fetchall())
    finally:
        sa.event.remove(conn, "before_cursor_execute", explain)


def test_an_event_with_one_consumer_does_not_scan_dag(engine, fan):
    # One asset scheduled on by every DAG, one asset by a single DAG.
    dag_ids = [f"dag_{n:05d}" for n in range(DAGS)]
    fan({"popular": dag_ids, "quiet": dag_ids[:1]})
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("quiet"), session=session, queue_mode="immediate")
        assert event is not None
        event_id = event.id
        form = statement.Form("events", "refresh")
        plans = {
            "the queue write": _plan(session.connection(), postgresql.one_statement(form), event_id),
            "the share lock alone": _plan(session.connection(), postgresql._share_lock(form), event_id),
        }
        session.rollback()
    for name, plan in plans.items():
        assert not re.search(r"Seq Scan on dag\b(?!_)", plan), f"{name}:\n{plan}"
        assert "dag_pkey" in plan, f"{name}:\n{plan}"


def test_a_popular_asset_among_quiet_ones_is_not_a_nested_loop_over_the_consumers(engine, fan):
    # 400 assets with one consumer each and one with 1,024: the planner expects about 3.
    dag_ids = [f"dag_{n:05d}" for n in range(1024)]
    fan({"popular": dag_ids, **{f"quiet_{n}": [dag_ids[n]] for n in range(400)}})
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("popular"), session=session, queue_mode="immediate")
        assert event is not None
        form = statement.Form("events", "refresh")
        plan = _plan(session.connection(), postgresql.one_statement(form), event.id)
        session.rollback()
    # The locked rows are only counted (for the stamp), never joined to the consumers.
    assert plan.count("CTE Scan on locked") == 1, plan
    assert not re.search(r"Seq Scan on dag\b(?!_)", plan), plan
