"""The benchmark's plan, report arithmetic and raw-SQL reference, without a database."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from sqlalchemy.dialects import mysql, postgresql, sqlite

from airflow_adrq_bench import rawsql, report
from airflow_adrq_bench.config import QUICK, SCENARIOS, STRATEGIES, Plan, Sizes
from airflow_adrq_bench.runner import VALUES_BATCH_NOTE, plan_cells

DATABASES = [
    ("sqlite", "sqlite:////tmp/x.db"),
    ("postgresql", "postgresql://u@h/db"),
    ("mariadb", "mysql+mysqldb://u@h/db"),
]


def test_plan_runs_values_batch_on_mysql_only_and_says_why():
    sizes = dataclasses.replace(QUICK, rounds=2)
    cells, skipped = plan_cells(DATABASES, sizes, STRATEGIES, SCENARIOS, random.Random(7))

    by_db = {db: [c for c in cells if c.db == db] for db, _ in DATABASES}
    assert {c.strategy for c in by_db["mariadb"]} == set(STRATEGIES)
    for db in ("sqlite", "postgresql"):
        assert "values_batch" not in {c.strategy for c in by_db[db]}
    assert skipped == [
        {"db": db, "strategy": "values_batch", "reason": VALUES_BATCH_NOTE} for db in ("sqlite", "postgresql")
    ]
    # Contention: every strategy x scenario x round; lost events: ours and Airflow's shape per hold.
    contention = [c for c in by_db["mariadb"] if c.scenario != "lost_events"]
    assert len(contention) == len(STRATEGIES) * 3 * 2
    lost = sorted((c.strategy, c.hold_ms) for c in by_db["mariadb"] if c.scenario == "lost_events")
    assert lost == sorted((s, h) for s in ("airflow_3_3", "commit_time") for h in sizes.lost_holds_ms)
    assert {c.producers for c in by_db["mariadb"] if c.scenario == "lost_events"} == {sizes.lost_producers}
    assert {c.producers for c in contention} == {sizes.producers}


def test_plan_order_is_random_within_each_database_and_indexed_in_run_order():
    cells, _ = plan_cells(DATABASES, QUICK, STRATEGIES, SCENARIOS, random.Random(1))
    again, _ = plan_cells(DATABASES, QUICK, STRATEGIES, SCENARIOS, random.Random(2))

    assert [c.index for c in cells] == list(range(len(cells)))
    # Databases stay in blocks (one engine at a time), in the given order.
    assert [db for db, _ in DATABASES] == list(dict.fromkeys(c.db for c in cells))
    key = [(c.db, c.scenario, c.strategy, c.hold_ms) for c in cells]
    assert key != [(c.db, c.scenario, c.strategy, c.hold_ms) for c in again]
    assert sorted(key) == sorted((c.db, c.scenario, c.strategy, c.hold_ms) for c in again)
    # The single rounds, whose tx/s the verdict compares, one after the other in each database.
    for db, _ in DATABASES:
        at = [i for i, c in enumerate(cells) if c.db == db and c.scenario == "single"]
        assert at == list(range(at[0], at[0] + len(at))) and len(at) > 1


def test_plan_parties_cover_the_largest_cell(tmp_path):
    sizes = dataclasses.replace(QUICK, producers=4, lost_producers=6)
    cells, _ = plan_cells(DATABASES[:1], sizes, STRATEGIES, SCENARIOS, random.Random(0))
    plan = Plan(out_dir=str(tmp_path), sizes=sizes, cells=cells)
    assert plan.parties == 7
    contention_only, _ = plan_cells(DATABASES[:1], sizes, STRATEGIES, ("single",), random.Random(0))
    assert Plan(out_dir=str(tmp_path), sizes=sizes, cells=contention_only).parties == 5


@pytest.mark.parametrize(
    "change", [{"lost_events": 0}, {"ratio_calls": 0}, {"ratio_fanouts": (0,)}, {"lost_holds_ms": (-1.0,)}]
)
def test_sizes_reject_nonsense(change):
    with pytest.raises(ValueError):
        dataclasses.replace(Sizes(), **change)


def _lost_cell(index, strategy, hold, lost, pairs=720, late=0):
    return {
        "index": index,
        "db": "postgresql",
        "scenario": "lost_events",
        "strategy": strategy,
        "round": 0,
        "hold_ms": hold,
        "producers": 6,
        "events": pairs // 3,
        "consumers": 3,
        "pairs": pairs,
        "lost_pairs": lost,
        "lost_events": lost,
        "late_pairs": late,
        "runs": 40,
        "passes": 400,
        "pass_p50_ms": 2.0,
        "duration_s": 3.0,
        "queue_rows_left": 0,
        "consumed_unknown": 0,
    }


def test_lost_events_rows_compare_ours_with_airflows_shape_at_each_hold():
    raw = {
        "targets": [{"name": "postgresql", "version": "PostgreSQL 15"}],
        "cells": [
            _lost_cell(0, "airflow_3_3", 5.0, 100),
            _lost_cell(1, "commit_time", 5.0, 10, late=4),
            _lost_cell(2, "airflow_3_3", 30.0, 0),
            _lost_cell(3, "commit_time", 30.0, 0),
        ],
        "transactions": [
            {
                "cell": 0,
                "ok": True,
                "attempts": 2,
                "latency_s": 0.01,
                "statements": 5,
                "assets": [1],
                "failures": {"deadlock": 1},
            },
            {
                "cell": 1,
                "ok": True,
                "attempts": 1,
                "latency_s": 0.004,
                "statements": 4,
                "assets": [1],
                "failures": {},
            },
        ],
        "sweeps": {},
    }

    rows = {(r["hold_ms"], r["strategy"]): r for r in report.aggregate_lost(raw)}

    assert rows[(5.0, "commit_time")]["vs_airflow_shaped"] == pytest.approx(0.1)
    assert rows[(5.0, "commit_time")]["lost_pct"] == pytest.approx(100 * 10 / 720)
    assert rows[(5.0, "airflow_3_3")]["deadlocks"] == 1 and rows[(5.0, "airflow_3_3")]["committed"] == 1
    assert rows[(30.0, "commit_time")]["vs_airflow_shaped"] == 0.0  # 0 of 0
    assert report.aggregate(raw) == []  # lost-events rounds are not contention rows
    text = report.format_lost(raw, list(rows.values()))
    assert "lost events, postgresql" in text
    assert "| 5 | commit_time* | 240 | 0 | 10 | 0.10x | 4 | 40 | 0 |" in " ".join(text.split())


def test_raw_sql_ratio_table():
    raw = {
        "targets": [{"name": "mariadb", "version": "MariaDB 10.11"}],
        "raw_sql_ratio": {
            "mariadb": [
                {
                    "fanout": 1024,
                    "calls": 40,
                    "rows_exact": True,
                    "ours_p25_ms": 2.5,
                    "ours_p50_ms": 3.0,
                    "ours_p75_ms": 3.5,
                    "ours_p95_ms": 4.0,
                    "raw_p50_ms": 2.0,
                    "raw_p95_ms": 2.0,
                    "ours_statements": 4,
                    "raw_statements": 4,
                    "ratio_p50": 1.5,
                    "ratio_p95": 2.0,
                }
            ]
        },
    }
    text = report.format_ratio(raw)
    assert "register_asset_change vs raw SQL, mariadb" in text
    assert "| F=1,024 | 3.00 | 2.00 | 1.50x | 4 / 4 | yes |" in " ".join(text.split())
    assert report.format_ratio({**raw, "raw_sql_ratio": {}}) == ""


def _mariadb():
    dialect = mysql.mysqldb.dialect()
    dialect.is_mariadb = True
    return dialect


@pytest.mark.parametrize(
    ("dialect", "placeholder", "returning", "conflict"),
    [
        (
            postgresql.psycopg.dialect(),
            "%(name)s",
            True,
            "WHERE asset_dag_run_queue.created_at < excluded.created_at)",
        ),
        (
            postgresql.psycopg2.dialect(),
            "%(name)s",
            True,
            "WHERE asset_dag_run_queue.created_at < excluded.created_at)",
        ),
        (sqlite.pysqlite.dialect(), ":name", True, "ON CONFLICT (asset_id, target_dag_id) DO NOTHING"),
        (_mariadb(), "%(name)s", True, "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id"),
        (
            mysql.mysqldb.dialect(),
            "%(name)s",
            False,
            "ON DUPLICATE KEY UPDATE asset_id = asset_dag_run_queue.asset_id",
        ),
    ],
)
def test_raw_sql_per_dialect(dialect, placeholder, returning, conflict):
    raw = rawsql.raw_sql(dialect)
    assert placeholder in raw.lookup
    assert raw.returning is returning and raw.insert_event.endswith(" RETURNING id") is returning
    (queue,) = [step for step in raw.steps if "INSERT INTO asset_dag_run_queue" in step]
    assert conflict in queue
    # In the queue's key order (PostgreSQL: of the consumers read once, as src).
    key_order = "src.asset_id, src.dag_id" if dialect.name == "postgresql" else "e.asset_id, r.dag_id"
    assert f"ORDER BY {key_order}" in queue
    # PostgreSQL: the consumers' dag rows share-locked (NOWAIT, under a SAVEPOINT) in the same statement.
    assert ("FOR SHARE OF d NOWAIT" in queue) is (dialect.name == "postgresql")
    assert (raw.begin == "BEGIN IMMEDIATE") is (dialect.name == "sqlite")


def test_percentile_is_nearest_rank():
    from airflow_adrq_bench.stats import percentile

    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([3.0], 95) == 3.0
    assert math.isnan(percentile([], 50))


def test_median_interval_narrows_with_more_values():
    from airflow_adrq_bench.stats import median_interval

    assert median_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)  # few values: the extremes
    assert median_interval([float(v) for v in range(1, 16)]) == (4.0, 12.0)
    assert median_interval([float(v) for v in range(1, 41)]) == (14.0, 27.0)
    assert all(math.isnan(v) for v in median_interval([]))
