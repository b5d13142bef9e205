# mypy: ignore-errors
"""``airflow-adrq bench`` end to end on SQLite (small), and the report's arithmetic."""

from __future__ import annotations

import json
import math

import pytest

from airflow_adrq.bench import report
from airflow_adrq.cli import main


@pytest.mark.slow
def test_bench_command_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "out"
    status = main(
        [
            "bench",
            "--db",
            f"sqlite:///{tmp_path / 'ignored.db'}",
            "--quick",
            "--producers",
            "2",
            "--scenario",
            "multi_outlet",
            "--scenario",
            "with_consumer",
            "--scenario",
            "lost_events",
            "--strategy",
            "airflow_3_3",
            "--strategy",
            "values_batch",
            "--strategy",
            "commit_time",
            "--sweep",
            "1,16",
            "--ratio-fanouts",
            "1,16",
            "--ratio-calls",
            "3",
            "--lost-producers",
            "2",
            "--lost-events",
            "10",
            "--lost-holds-ms",
            "1",
            "--out",
            str(out),
        ]
    )

    assert status == 0
    printed = capsys.readouterr()
    assert "SQLite serialises writers" in printed.err
    assert "| multi_outlet  | commit_time" in printed.out
    # PR #69977 changed MySQL only: not run, and said so, on SQLite.
    assert "values_batch is apache/airflow PR #69977" in printed.out
    result = json.loads((out / "bench.json").read_text())
    rows = {(r["scenario"], r["strategy"]): r for r in result["summary"]}
    assert set(rows) == {
        (s, t) for s in ("multi_outlet", "with_consumer") for t in ("airflow_3_3", "commit_time")
    }
    for row in rows.values():
        assert row["rows_exact"] is True
        assert row["committed"] == 2 * 3  # producers x transactions, nothing given up on SQLite
        assert row["deadlocks"] == 0
    # Airflow 3.3.2's whole path per outlet on SQLite: lookup, alias SELECT, event
    # INSERT, ref SELECT, then per unpaused consumer (8 of them) SAVEPOINT, SELECT
    # (merge), RELEASE, plus an INSERT where the row is new: only in the round's first
    # transaction, SQLite running them one at a time.
    assert rows[("multi_outlet", "airflow_3_3")]["statements_per_tx"] == 2 * (4 + 3 * 8)
    sweep = {(r["strategy"], r["fanout"]): r for r in result["sweeps"]["sqlite"]}
    assert {s for s, _ in sweep} == {"airflow_3_3", "commit_time"}
    assert sweep[("airflow_3_3", 16)]["statements"] == 4 + 4 * 16
    # One statement shape whatever the fan-out.
    assert sweep[("commit_time", 1)]["statements"] == sweep[("commit_time", 16)]["statements"]
    assert all(r["rows_exact"] for r in sweep.values())

    ratio = {r["fanout"]: r for r in result["raw_sql_ratio"]["sqlite"]}
    assert set(ratio) == {1, 16}
    for r in ratio.values():
        assert r["rows_exact"] is True and r["raw_statements"] == 4 and r["calls"] == 3
        assert r["ratio_p50"] == pytest.approx(r["ours_p50_ms"] / r["raw_p50_ms"])
    assert "register_asset_change vs raw SQL, sqlite" in printed.out

    lost = {r["strategy"]: r for r in result["lost_events"]}
    assert set(lost) == {"airflow_3_3", "commit_time"}
    for r in lost.values():
        assert (r["events"], r["consumers"], r["pairs"]) == (10, 3, 30)
        # SQLite serialises writers, the scheduler included: nothing can be lost.
        assert r["lost_pairs"] == 0 and r["queue_rows_left"] == 0 and r["consumed_unknown"] == 0
    assert "lost events, sqlite" in printed.out
    assert (out / "bench-sqlite.png").stat().st_size > 10_000


def _tx(cell, ok, latency_ms, statements=2, **failures):
    return {
        "cell": cell,
        "ok": ok,
        "attempts": 1 + sum(failures.values()),
        "latency_s": latency_ms / 1000,
        "statements": statements,
        "assets": [1],
        "failures": failures,
    }


def test_report_aggregates_percentiles_failures_and_ratios():
    cell = {
        "db": "postgresql",
        "scenario": "single",
        "round": 0,
        "exact": True,
        "duration_s": 2.0,
        "check": {},
        "consumer": {},
    }
    raw = {
        "targets": [{"name": "postgresql", "version": "PostgreSQL 15"}],
        "cells": [
            {**cell, "index": 0, "strategy": "airflow_3_3"},
            {**cell, "index": 1, "strategy": "commit_time"},
        ],
        "transactions": [
            _tx(0, True, 100, statements=36, deadlock=2),
            _tx(0, False, 900, deadlock=3, lock_timeout=1),
            *(_tx(1, True, ms) for ms in range(1, 101)),
        ],
        "sweeps": {},
    }

    rows = {r["strategy"]: r for r in report.aggregate(raw)}

    base, ours = rows["airflow_3_3"], rows["commit_time"]
    assert (base["committed"], base["abandoned"], base["deadlocks"], base["lock_timeouts"]) == (1, 1, 5, 1)
    assert base["retries"] == 6
    assert base["tx_per_s"] == 0.5
    assert ours["tx_per_s"] == 50.0 and ours["throughput_vs_airflow_3_3"] == 100.0
    assert (ours["p50_ms"], ours["p95_ms"], ours["p99_ms"], ours["max_ms"]) == pytest.approx(
        (50, 95, 99, 100)
    )
    assert ours["p99_vs_airflow_3_3"] == pytest.approx(0.99)
    assert ours["statements_per_tx"] == 2 and base["statements_per_tx"] == 36
    assert math.isnan(report.aggregate({**raw, "transactions": []})[0]["p50_ms"])
