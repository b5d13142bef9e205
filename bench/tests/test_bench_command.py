"""``airflow-adrq bench`` end to end on SQLite (small), and the report's arithmetic."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_adrq.cli import main
from airflow_adrq_bench import report, runner
from airflow_adrq_bench.config import QUICK

#: The wide detail bench.md leaves out, beside it.
CSV = ["bench-contention.csv", "bench-lost.csv", "bench-ratio.csv", "bench-sweep.csv"]


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
            "5",
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
    # Progress of the long work, on stderr.
    assert "concurrent rounds" in printed.err and "fan-out sweep" in printed.err
    # Only the results stay: the barrier files and per-process records are gone.
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*CSV, "bench-sqlite.png", "bench.json", "bench.md"]
    )
    # The terminal gets the verdict, last in bench.md; every table there is followed by its legend.
    bench_md = (out / "bench.md").read_text()
    assert printed.out.startswith("## Verdict") and printed.out.split("\ntook ")[0] in bench_md
    for legend in ("contention tables", "lost events", "fan-out sweep", "raw SQL", "verdict"):
        assert f"Legend ({legend})" in bench_md
    assert "| commit_time* |" in bench_md and "| multi_outlet  | commit_time*" in bench_md
    # Every line within 100 columns, on the terminal (progress aside: rich draws it) and in the file.
    assert max(len(line) for text in (printed.out, bench_md) for line in text.splitlines()) <= 100
    assert "commit_time (default)" in (out / "bench-contention.csv").read_text()
    # PR #69977 changed MySQL only: not run, and said so, on SQLite.
    assert "values_batch is apache/airflow PR #69977" in bench_md
    result = json.loads((out / "bench.json").read_text())
    rows = {(r["scenario"], r["strategy"]): r for r in result["summary"]}
    assert set(rows) == {
        (s, t) for s in ("multi_outlet", "with_consumer") for t in ("airflow_3_3", "commit_time")
    }
    for row in rows.values():
        assert row["rows_exact"] is True
        # producers x transactions, nothing given up on SQLite
        assert row["committed"] == row["planned"] == 2 * QUICK.transactions
        assert row["abandoned"] == row["not_started"] == 0
        assert row["deadlocks"] == 0
    assert len(result["transactions"]) == sum(c["planned"] for c in result["cells"])
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
        # SQLite's reference: lookup, event, Python's clock on the event, then the queue rows with it.
        assert r["rows_exact"] is True and r["raw_statements"] == 4 and r["calls"] == 5
        assert r["ratio_p50"] == pytest.approx(r["ours_p50_ms"] / r["raw_p50_ms"])
    assert "register_asset_change vs raw SQL, sqlite" in bench_md

    lost = {r["strategy"]: r for r in result["lost_events"]}
    assert set(lost) == {"airflow_3_3", "commit_time"}
    for r in lost.values():
        assert (r["events"], r["consumers"], r["pairs"]) == (10, 3, 30)
        # SQLite serialises writers, the scheduler included: nothing can be lost.
        assert r["lost_pairs"] == 0 and r["queue_rows_left"] == 0 and r["consumed_unknown"] == 0
    assert "lost events, sqlite" in bench_md
    assert (out / "bench-sqlite.png").stat().st_size > 10_000


@pytest.mark.parametrize("keep", [False, True])
def test_scratch_files_are_removed_on_failure_unless_kept(tmp_path, monkeypatch, keep):
    """A party fails: the scratch goes (that of an earlier run in the directory too), unless kept."""

    def fail(plan):
        (Path(plan.out_dir) / "tx-1.jsonl").write_text("{}\n")
        raise runner.BenchError("a party failed")

    monkeypatch.setattr(runner, "_run_parties", fail)
    sizes = dataclasses.replace(QUICK, producers=1, sweep=(1,), ratio_fanouts=(1,))
    out = tmp_path / "out"
    (out / "barriers").mkdir(parents=True)
    (out / "barriers" / "warm-0.0").touch()  # left over from an earlier run in the same directory
    (out / "tx-9.jsonl").write_text("{}\n")

    with pytest.raises(runner.BenchError, match="a party failed"):
        runner.run([runner.describe("sqlite://")], sizes, out, scenarios=("single",), keep_scratch=keep)

    left = sorted(p.name for p in out.iterdir())
    if keep:
        assert left == ["barriers", "tx-1.jsonl"] and list((out / "barriers").iterdir()) == []
    else:
        assert left == []


@pytest.mark.backends("postgresql", "mysql")
def test_counts_add_up_when_the_round_timeout_cuts_rounds_short(tmp_path, capsys, backend, server_info):
    """A round timeout far too short (given, so kept, with a warning): every planned transaction
    is still committed, gave up or not started, and the deadlock timeout is read from the server."""
    expected = 0.0
    if backend == "postgresql":
        engine = sa.create_engine(server_info.url)
        with engine.connect() as conn:
            expected = float(
                conn.scalar(sa.text("SELECT setting FROM pg_settings WHERE name = 'deadlock_timeout'"))
            )
        engine.dispose()
        expected /= 1000
    assert runner.deadlock_timeout_s(server_info.url) == expected

    out = tmp_path / "out"
    status = main(
        [
            "bench",
            "--db",
            server_info.url,
            "--quick",
            "--scenario",
            "multi_outlet",
            "--strategy",
            "airflow_3_3",
            "--strategy",
            "commit_time",
            "--transactions",
            "6",
            "--round-timeout-s",
            "0.2",
            # Each transaction stays open 100 ms: at most 3 of a producer's 6 start in 0.2 s.
            "--hold-ms",
            "100",
            "--sweep",
            "1",
            "--ratio-fanouts",
            "1",
            "--ratio-calls",
            "5",
            "--out",
            str(out),
        ]
    )

    assert status == 0
    printed = capsys.readouterr()
    if expected >= 0.2 / 5:
        assert "warning: --round-timeout-s 0.2 is below" in printed.err
    result = json.loads((out / "bench.json").read_text())
    assert result["sizes"]["round_timeout_s"] == 0.2
    # One row per strategy asked for, so the loop below cannot pass by checking nothing.
    assert {(r["scenario"], r["strategy"]) for r in result["summary"]} == {
        ("multi_outlet", "airflow_3_3"),
        ("multi_outlet", "commit_time"),
    }
    for row in result["summary"]:
        assert row["planned"] == QUICK.producers * 6
        assert row["committed"] + row["abandoned"] + row["not_started"] == row["planned"], row
        assert row["accounted"] is True
        assert row["not_started"] >= QUICK.producers * 3, row
    outcomes = [tx["outcome"] for tx in result["transactions"]]
    assert len(outcomes) == 2 * QUICK.producers * 6
    assert set(outcomes) <= {"committed", "gave up", "not started"}
    assert sorted(p.name for p in out.iterdir()) == sorted(
        # No lost_events rounds: no bench-lost.csv.
        [c for c in CSV if c != "bench-lost.csv"]
        + ["bench.json", "bench.md", f"bench-{result['targets'][0]['name']}.png"]
    )


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
    assert ours["tx_per_s"] == 50.0
    assert (ours["p25_ms"], ours["p50_ms"], ours["p75_ms"], ours["p95_ms"], ours["max_ms"]) == pytest.approx(
        (25, 50, 75, 95, 100)
    )
    # airflow_3_3 gave one up: no ratio (it would measure the round's time budget) ...
    assert math.isnan(ours["throughput_vs_airflow_3_3"]) and math.isnan(ours["p99_vs_airflow_3_3"])
    # ... nor where it committed everything but deadlocked on the way (it would measure the wait for
    # PostgreSQL's deadlock_timeout) ...
    raw["transactions"][1] = _tx(0, True, 100)
    ours = {r["strategy"]: r for r in report.aggregate(raw)}["commit_time"]
    assert math.isnan(ours["throughput_vs_airflow_3_3"])
    # ... which there is once it committed everything without a deadlock.
    raw["transactions"][0] = _tx(0, True, 100, statements=36)
    ours = {r["strategy"]: r for r in report.aggregate(raw)}["commit_time"]
    assert ours["throughput_vs_airflow_3_3"] == 50.0 and ours["p99_vs_airflow_3_3"] == pytest.approx(0.99)
    assert ours["statements_per_tx"] == 2 and base["statements_per_tx"] == 36
    assert math.isnan(report.aggregate({**raw, "transactions": []})[0]["p50_ms"])
