"""The test support's baselines are Airflow 3.3.2's whole ``register_asset_change``, on every backend.

* Statements per call, empty queue, no aliases: PostgreSQL 5 (lookup, alias
  SELECT, event INSERT, ref SELECT, one queue INSERT); MySQL/MariaDB and
  SQLite 4 + 4 per consumer (SAVEPOINT, SELECT, INSERT, RELEASE); PR #69977's
  ``values_batch`` on MySQL/MariaDB 5.
* The same queue rows, events and alias rows as :func:`airflow_adrq.register_asset_change`
  over a graph with direct, name, URI and alias references, paused and
  partitioned consumers.
* The lost-events consumer applies Airflow 3.3.2's window rule.
"""

from __future__ import annotations

import datetime as dt
import logging
import random

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq.models import (
    AssetDagRunQueue,
    AssetEvent,
    alias_association_table,
    asset_alias_asset_event_association_table,
    utcnow,
)
from airflow_adrq_testing import baselines, dataset, scheduler, strategies
from airflow_adrq_testing.recording import counting
from tests.factories import (
    add_graph,
    add_scheduled_assets,
    alias_event_links,
    alias_links,
    asset_ref,
    queued,
    task_instance,
)


@pytest.fixture
def bench_engine(db_url):
    eng = dataset.bench_engine(db_url, lock_timeout_s=5)
    yield eng
    eng.dispose()


def _graph(eng, *, fanout=3):
    """asset ``a`` with ``fanout`` direct consumers, a paused and a partitioned one,
    a name and a URI consumer, and an alias ``al`` with its own consumer."""
    a = ("a", "s3://bucket/a")
    direct = [f"d{i}" for i in range(fanout)]
    with Session(eng) as session:
        asset_ids, _ = add_graph(
            session,
            dags=[*direct, "paused", "part", "by_name", "by_uri", "by_alias"],
            paused={"paused"},
            partitioned={"part"},
            assets=[a],
            aliases=["al"],
            direct=[(a, d) for d in [*direct, "paused", "part"]],
            by_name=[("a", "by_name")],
            by_uri=[(a[1], "by_uri")],
            by_alias=[("al", "by_alias")],
        )
        session.commit()
    return asset_ids[a]


def _state(eng):
    with eng.connect() as conn:
        return {
            "queue": queued(conn),
            "events": [
                tuple(r)
                for r in conn.execute(
                    sa.select(
                        AssetEvent.asset_id,
                        AssetEvent.extra,
                        AssetEvent.source_dag_id,
                        AssetEvent.source_task_id,
                        AssetEvent.source_run_id,
                        AssetEvent.source_map_index,
                        AssetEvent.partition_key,
                    )
                )
            ],
            "alias_events": len(alias_event_links(conn)),
            "alias_links": set(alias_links(conn)),
        }


def _clear(eng):
    with eng.begin() as conn:
        for table in (
            asset_alias_asset_event_association_table,
            AssetDagRunQueue.__table__,
            AssetEvent.__table__,
            alias_association_table,
        ):
            conn.execute(sa.delete(table))


@pytest.mark.parametrize("queueing", baselines.BASELINES)
@pytest.mark.parametrize("aliases", [(), ("al",)], ids=["no-alias", "alias"])
def test_baseline_writes_what_the_library_writes(backend, bench_engine, queueing, aliases):
    asset_id = _graph(bench_engine)
    ti = task_instance()

    def writes(register, **kw):
        """What one committed call of ``register`` writes, then cleared for the next one."""
        with Session(bench_engine) as session:
            register(
                asset=asset_ref("a"),
                task_instance=ti,
                session=session,
                extra={"k": 1},
                source_alias_names=aliases,
                **kw,
            )
            session.commit()
        state = _state(bench_engine)
        _clear(bench_engine)
        return state

    theirs = writes(baselines.register_asset_change, queueing=queueing, rng=random.Random(1))
    ours = writes(airflow_adrq.register_asset_change)

    assert theirs == ours
    expected = {(asset_id, d) for d in ("d0", "d1", "d2", "by_name", "by_uri")}
    if aliases:
        expected.add((asset_id, "by_alias"))
    assert theirs["queue"] == expected


@pytest.mark.parametrize("queueing", baselines.BASELINES)
def test_baseline_statements_per_call_match_airflow_3_3_2(backend, bench_engine, queueing):
    fanout = 7
    with Session(bench_engine) as session:
        asset_id = add_scheduled_assets(session, {"a": [f"d{i}" for i in range(fanout)]})["a"]
        session.commit()

    counting.reset()
    with Session(bench_engine) as session:
        baselines.register_asset_change(asset=asset_ref("a"), session=session, queueing=queueing)
        session.commit()
    sent = counting.value()

    mysql = bench_engine.dialect.name == "mysql"
    if bench_engine.dialect.name == "postgresql" or (queueing == "values_batch" and mysql):
        assert sent == 5
    else:
        assert sent == 4 + 4 * fanout
    assert queued(bench_engine) == {(asset_id, f"d{i}") for i in range(fanout)}


def test_baseline_unknown_asset_warns_and_writes_nothing(backend, bench_engine, caplog):
    with Session(bench_engine) as session, caplog.at_level(logging.WARNING):
        assert baselines.register_asset_change(asset=asset_ref("nope"), session=session) is None
        session.commit()
    assert "not found; cannot create asset event" in caplog.text
    assert _state(bench_engine)["events"] == []


def test_baseline_partition_key_queues_nothing(backend, bench_engine):
    _graph(bench_engine)
    with Session(bench_engine) as session:
        baselines.register_asset_change(asset=asset_ref("a"), session=session, partition_key="p1")
        session.commit()
    assert queued(bench_engine) == set()
    assert len(_state(bench_engine)["events"]) == 1


def test_values_batch_applies_to_mysql_only():
    assert baselines.applies_to("values_batch", "mysql")
    assert not baselines.applies_to("values_batch", "postgresql")
    assert not baselines.applies_to("values_batch", "sqlite")
    assert all(
        baselines.applies_to(s, b) for s in ("airflow_3_3", "sorted_loop") for b in ("sqlite", "postgresql")
    )
    assert strategies.applies_to("commit_time", "sqlite")


def test_recorded_pass_applies_airflow_3_3_2_window_rule(backend, bench_engine):
    """triggered_date = newest created_at; events with previous run_after < timestamp <= it."""
    with Session(bench_engine) as session:
        asset_id = add_scheduled_assets(session, {"a": ["c"]})["a"]
        session.commit()
    dataset.bench_metadata.create_all(bench_engine)
    t0 = utcnow()

    def event(seconds):
        with bench_engine.begin() as conn:
            result = conn.execute(
                sa.insert(AssetEvent.__table__).values(
                    asset_id=asset_id, extra={}, timestamp=t0 + dt.timedelta(seconds=seconds)
                )
            )
            return result.inserted_primary_key[0]

    def queue_row(seconds):
        with bench_engine.begin() as conn:
            conn.execute(
                sa.insert(AssetDagRunQueue.__table__).values(
                    asset_id=asset_id, target_dag_id="c", created_at=t0 + dt.timedelta(seconds=seconds)
                )
            )

    def run_pass():
        consumed = []
        with Session(bench_engine) as session:
            runs = scheduler.recorded_pass(session, ["c"], consumed)
            session.commit()
        return runs, sorted(e for e, _ in consumed)

    try:
        e1, e2 = event(1), event(2)
        queue_row(2)
        e3 = event(3)  # after triggered_date: not this run's
        assert run_pass() == (1, [e1, e2])
        assert run_pass() == (0, [])  # queue empty: no run
        # An event at or before the previous run_after is never consumed again: the window is (2, 4].
        event(2)
        queue_row(4)
        assert run_pass() == (1, [e3])
        assert queued(bench_engine) == set()
    finally:
        with bench_engine.begin() as conn:
            conn.execute(sa.delete(dataset.bench_run))
