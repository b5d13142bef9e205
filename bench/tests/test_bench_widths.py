"""What ``airflow-adrq bench`` prints and writes, from a run made up to be as wide as they come (three
servers with long versions, baselines that deadlock, four-digit latencies, every fan-out): every line at
most 100 columns, and the exit status the verdict gives. The measurement is faked; everything after it,
from the aggregates to the files, runs as it does for real."""

from __future__ import annotations

import dataclasses
import random

import pytest

from airflow_adrq_bench import cli, config, report, runner
from airflow_adrq_bench.exits import Exit
from airflow_adrq_testing import dataset
from airflow_adrq_testing.transactions import NOT_STARTED

WIDTH = 100
VERSIONS = {
    "sqlite": "SQLite 3.40.1",
    "postgresql": "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu",
    "mariadb": "MariaDB 10.11.19-MariaDB-0+deb12u1 from Debian -- the MariaDB server",
}
STRATEGIES = ("airflow_3_3", "sorted_loop", "values_batch", "per_call", "commit_time")


def _tx(cell, rng, *, ok=True, deadlocks=0, started=True):
    outcome = "committed" if ok else ("gave up" if started else NOT_STARTED)
    return {
        "cell": cell,
        "party": 1,
        "ok": ok,
        "attempts": 1 + deadlocks if started else 0,
        "latency_s": rng.uniform(0.004, 9.5),
        "statements": rng.choice([5, 28, 1028, 40004]),
        "assets": [1],
        "failures": {"deadlock": deadlocks, "lock_timeout": 1} if deadlocks else {},
        "gave_up": None if ok or not started else "round timeout",
        "last_failure": "deadlock" if deadlocks else None,
        "outcome": outcome,
    }


def _fake_raw(targets, sizes, *, ours_ok=True, seed=7):
    """A run's raw results: every (database, scenario, strategy), stock deadlocking everywhere."""
    rng = random.Random(seed)
    cells, txs, sweeps, ratios = [], [], {}, {}
    for target in targets:
        db = target.name
        for scenario in ("single", "multi_outlet", "with_consumer"):
            for strategy in STRATEGIES:
                cell = config.Cell(len(cells), db, "", strategy, scenario, 0, sizes.hold_ms, sizes.producers)
                planned = cell.planned(sizes)
                stock = strategy == "airflow_3_3"
                bad = stock or (strategy == "commit_time" and not ours_ok)
                # Ours the fastest: the verdict's counts below are then known.
                duration = 0.2 if strategy == "commit_time" else rng.uniform(2.0, 12.0)
                record = {**dataclasses.asdict(cell), "duration_s": duration, "planned": planned}
                cells.append(record | {"exact": True, "check": {}, "consumer": {}})
                for k in range(planned):
                    txs.append(_tx(cell.index, rng, ok=not (bad and k % 3), deadlocks=7 if bad else 0))
        for hold in sizes.lost_holds_ms:
            for strategy in ("airflow_3_3", "commit_time"):
                index = len(cells)
                cells.append(
                    {
                        **dataclasses.asdict(
                            config.Cell(index, db, "", strategy, "lost_events", 0, hold, sizes.lost_producers)
                        ),
                        "duration_s": 3.0,
                        "planned": sizes.lost_events,
                        "events": sizes.lost_events,
                        "consumers": sizes.lost_consumers,
                        "pairs": sizes.lost_events * sizes.lost_consumers,
                        "lost_pairs": 12345 if strategy == "airflow_3_3" else 0,
                        "late_pairs": 9999,
                        "runs": 12345,
                        "passes": 123456,
                        "queue_rows_left": 0,
                        "consumed_unknown": 0,
                    }
                )
                txs += [_tx(index, rng, deadlocks=3) for _ in range(sizes.lost_events)]
        sweeps[db] = [
            {
                "strategy": s,
                "fanout": f,
                **{f"p{q}_ms": 12345.678 + q for q in (25, 50, 75, 95, 99)},
                "latency_s": 12.3,
                "statements": 40004,
                "rows_exact": f != 1,
            }
            for s in STRATEGIES
            for f in (1, 16, 256, 1024, 10000)
        ]
        ratios[db] = [
            {
                "fanout": f,
                "calls": 40,
                "rows_exact": True,
                **{f"{side}_p{q}_ms": 1234.567 for side in ("ours", "raw") for q in (25, 50, 75, 95)},
                **{f"{side}_ci_{e}_ms": 1234.5 for side in ("ours", "raw") for e in ("low", "high")},
                "ours_statements": 7,
                "raw_statements": 6,
                "ratio_p50": 12.34,
                "ratio_p95": 123.4,
            }
            for f in (1, 1024)
        ]
    return {
        "started_at": 0.0,
        "duration_s": 12345.6,
        "sizes": dataclasses.asdict(sizes),
        "targets": [{"name": t.name, "version": t.version} for t in targets],
        "cells": cells,
        "transactions": txs,
        "sweeps": sweeps,
        "raw_sql_ratio": ratios,
        "skipped": [{"db": "sqlite", "strategy": "values_batch", "reason": runner.VALUES_BATCH_NOTE}],
        "cell_order_seed": 1,
        "machine": {"cpus": 2, "python": "3.11"},
    }


@pytest.fixture
def faked(monkeypatch, tmp_path):
    """``cli.main`` on three made-up servers; the raw results :func:`_fake_raw` makes."""
    made = {"ours_ok": True}

    def describe(url):
        name = url.split(":")[0]
        return dataset.Target(name, name, url, VERSIONS[name])

    monkeypatch.setattr(runner, "describe", describe)
    monkeypatch.setattr(
        runner, "deadlock_timeout_s", lambda url: 1.0 if url.startswith("postgresql") else 0.0
    )

    def run(targets, sizes, out, **kw):
        out.mkdir(parents=True, exist_ok=True)
        return _fake_raw(targets, sizes, **made)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(report, "plot", lambda *args: [])  # PNGs have no lines, and take seconds

    def bench(*argv):
        dbs = ["--db", "sqlite://", "--db", "postgresql://u@h/db", "--db", "mariadb://u@h/db"]
        return cli.main(["--quick", *dbs, "--out", str(tmp_path / "out"), *argv])

    bench.made = made
    bench.out = tmp_path / "out"
    return bench


def _widest(text):
    return max(((len(line), line) for line in text.splitlines()), default=(0, ""))


def test_every_line_printed_and_written_fits_100_columns(faked, capsys):
    assert faked() == Exit.OK
    printed = capsys.readouterr()
    for name, text in (
        ("stdout", printed.out),
        ("stderr", printed.err),
        ("bench.md", (faked.out / "bench.md").read_text()),
    ):
        width, line = _widest(text)
        assert width <= WIDTH, f"{name}: {width} columns: {line}"
    # The verdict on the terminal: both sides, and counts that add up to its rows.
    assert "| airflow-adrq | airflow_3_3 | sorted_loop | verdict |" in " ".join(printed.out.split())
    assert "deadlocked (" in printed.out
    assert "15 met, 0 MISSED, 0 unclear of 15 targets" in printed.out
    # The wide detail beside it.
    for name in ("contention", "lost", "sweep", "ratio"):
        header = (faked.out / f"bench-{name}.csv").read_text().splitlines()[0]
        assert header.startswith("database,"), name
    assert "p95 ms" in (faked.out / "bench-contention.csv").read_text().splitlines()[0]


def test_a_missed_target_exits_1_with_check_and_0_without(faked, capsys):
    faked.made["ours_ok"] = False
    assert faked() == Exit.OK  # the checks of the measurement passed: without --check, a report
    assert faked("--check") == Exit.MISSED
    err = " ".join(capsys.readouterr().err.split())
    assert "ERROR: target missed: postgresql deadlocks" in err


def test_an_unclear_target_exits_3_with_check_unless_allowed(faked, monkeypatch, capsys):
    from airflow_adrq_bench import verdict

    real = verdict.ratio_line

    def unclear(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), verdict="unclear")

    monkeypatch.setattr(verdict, "ratio_line", unclear)
    assert faked("--check") == Exit.UNCLEAR
    assert "ERROR: target unclear: sqlite tx/s" in " ".join(capsys.readouterr().err.split())
    assert faked("--check", "--allow-unclear") == Exit.OK
    assert faked() == Exit.OK
