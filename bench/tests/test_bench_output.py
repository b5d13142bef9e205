"""What ``airflow-adrq bench`` prints, without a database: counts that add up, the progress
counter, timeouts clear of ``deadlock_timeout``, legends, and the help text."""

from __future__ import annotations

import dataclasses
import random

import pytest

from airflow_adrq_bench import cli, config, engine, options, report, runner
from airflow_adrq_testing.transactions import GAVE_UP_ATTEMPTS, GAVE_UP_TIMEOUT, NOT_STARTED, TxResult

# --- every planned transaction is accounted for ------------------------------------


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    ("outcomes", "deadline"),
    [
        ([], 100.0),  # all commit in time
        (["gave up"], 100.0),
        (["commit", "gave up", "commit"], 2.5),  # the round timeout passes after the third
        (["gave up"] * 5, 0.5),  # the first one runs past the deadline
    ],
)
def test_round_records_account_for_every_planned_transaction(outcomes, deadline):
    clock = _Clock()
    script = iter(outcomes)

    def run_one():
        clock.now += 1.0  # every transaction takes a second
        gave_up = next(script, "commit") == "gave up"
        if gave_up:
            return TxResult(False, 3, 1.0, 0, [1], {"deadlock": 3}, GAVE_UP_TIMEOUT, "deadlock")
        return TxResult(True, 1, 1.0, 4, [1])

    planned = 7
    records = list(engine.round_records(planned, deadline, run_one, clock=clock))

    assert len(records) == planned
    started = [r for r in records if r["outcome"] != NOT_STARTED]
    committed = [r for r in records if r["outcome"] == "committed"]
    gave_up = [r for r in records if r["outcome"] == "gave up"]
    not_started = [r for r in records if r["outcome"] == NOT_STARTED]
    assert len(committed) + len(gave_up) + len(not_started) == planned
    # Transactions start while the deadline has not passed, each taking 1 s of the fake clock.
    assert len(started) == min(planned, int(deadline) + 1)
    # Not started ones come last, and look like nothing happened.
    assert records[len(started) :] == not_started
    assert all(r["attempts"] == 0 and not r["ok"] and r["failures"] == {} for r in not_started)
    assert all(r["ok"] for r in committed) and not any(r["ok"] for r in gave_up)


def _cell(index, strategy, planned=None, scenario="multi_outlet"):
    cell = {
        "index": index,
        "db": "postgresql",
        "scenario": scenario,
        "strategy": strategy,
        "round": 0,
        "hold_ms": 5.0,
        "producers": 4,
        "exact": True,
        "duration_s": 2.0,
        "check": {},
        "consumer": {},
    }
    if planned is not None:
        cell["planned"] = planned
    return cell


def _tx(cell, outcome, *, gave_up=None, last=None, attempts=1, **failures):
    return {
        "cell": cell,
        "party": 1,
        "ok": outcome == "committed",
        "attempts": 0 if outcome == NOT_STARTED else attempts,
        "latency_s": 0.01,
        "statements": 4,
        "assets": [1],
        "failures": failures,
        "gave_up": gave_up,
        "last_failure": last,
        "outcome": outcome,
    }


def _raw(cells, txs):
    return {
        "targets": [{"name": "postgresql", "version": "PostgreSQL 15"}],
        "sizes": dataclasses.asdict(config.QUICK),
        "cells": cells,
        "transactions": txs,
        "sweeps": {},
    }


def test_summary_rows_add_up_to_the_plan_and_say_why_transactions_gave_up():
    txs = [
        *[_tx(0, "committed") for _ in range(5)],
        _tx(0, "committed", attempts=3, deadlock=2),
        _tx(0, "gave up", gave_up=GAVE_UP_TIMEOUT, last="deadlock", attempts=4, deadlock=4),
        _tx(0, "gave up", gave_up=GAVE_UP_TIMEOUT, last="deadlock", attempts=2, deadlock=2),
        _tx(0, "gave up", gave_up=GAVE_UP_ATTEMPTS, last="lock_timeout", attempts=2, lock_timeout=2),
        *[_tx(0, NOT_STARTED) for _ in range(3)],
        *[_tx(1, "committed") for _ in range(12)],
    ]
    raw = _raw([_cell(0, "per_call", 12), _cell(1, "commit_time", 12)], txs)

    rows = {r["strategy"]: r for r in report.aggregate(raw)}

    per_call = rows["per_call"]
    assert (per_call["planned"], per_call["committed"], per_call["abandoned"], per_call["not_started"]) == (
        12,
        6,
        3,
        3,
    )
    assert per_call["committed"] + per_call["abandoned"] + per_call["not_started"] == per_call["planned"]
    assert per_call["accounted"] and rows["commit_time"]["accounted"]
    # Not-started transactions made no attempt: they add no retries or failures.
    assert per_call["retries"] == 2 + 3 + 1 + 1 and per_call["deadlocks"] == 8
    assert per_call["gave_up_why"] == {
        "round timeout (last error: deadlock)": 2,
        "max attempts (last error: lock timeout)": 1,
    }
    assert report.problems({}, list(rows.values())) == []
    text = report.format_table(raw, list(rows.values()))
    # The cells, whatever the columns' widths: planned above the table, then ok, gave up, not started.
    assert "planned transactions per row: multi_outlet 12" in text
    assert "| multi_outlet | per_call | 6 | 3 | 3 | 8 | 2 | 7 | yes |" in " ".join(text.split())
    assert (
        "> gave up, multi_outlet/per_call: 2 round timeout (last error: deadlock); "
        "1 max attempts (last error: lock timeout)" in text
    )


def test_counts_that_do_not_add_up_are_an_error():
    # A producer's records went missing: 10 recorded, 12 planned.
    txs = [_tx(0, "committed") for _ in range(9)] + [_tx(0, NOT_STARTED)]
    raw = _raw([_cell(0, "commit_time", 12)], txs)

    rows = report.aggregate(raw)

    assert not rows[0]["accounted"]
    assert report.problems({}, rows) == [
        "postgresql multi_outlet/commit_time: 9 committed + 0 gave up + 1 not started "
        "!= 12 planned transactions"
    ]
    assert "COUNTS DO NOT ADD UP" in report.format_table(raw, rows)


def test_lost_events_rows_add_up_to_the_plan():
    cell = {
        **_cell(0, "airflow_3_3", 48, scenario="lost_events"),
        "events": 44,
        "consumers": 3,
        "pairs": 132,
        "lost_pairs": 4,
        "lost_events": 4,
        "late_pairs": 0,
        "runs": 10,
        "passes": 20,
        "queue_rows_left": 0,
        "consumed_unknown": 0,
    }
    txs = (
        [_tx(0, "committed") for _ in range(44)]
        + [_tx(0, "gave up", gave_up=GAVE_UP_ATTEMPTS, last="deadlock", attempts=50, deadlock=50)]
        + [_tx(0, NOT_STARTED) for _ in range(3)]
    )
    lost = report.aggregate_lost(_raw([cell], txs))

    assert (lost[0]["planned"], lost[0]["committed"], lost[0]["abandoned"], lost[0]["not_started"]) == (
        48,
        44,
        1,
        3,
    )
    assert lost[0]["accounted"] and lost[0]["deadlocks"] == 50
    assert report.problems({}, [], lost) == []


def test_a_cell_plans_producers_times_transactions_or_the_lost_events():
    cells, _ = runner.plan_cells(
        [("postgresql", "postgresql://u@h/db")],
        config.QUICK,
        config.STRATEGIES,
        config.SCENARIOS,
        random.Random(3),
    )
    # Every scenario is planned, so the loop below checks the lost_events rule and the other one.
    assert {cell.scenario for cell in cells} == set(config.SCENARIOS)
    for cell in cells:
        quick = config.QUICK
        per_producer = quick.single_transactions if cell.scenario == "single" else quick.transactions
        expected = quick.lost_events if cell.scenario == "lost_events" else quick.producers * per_producer
        assert cell.planned(quick) == expected
    # The lost_events split over producers adds up to the plan.
    assert sum(engine.share(config.QUICK.lost_events, 5, p) for p in range(1, 6)) == config.QUICK.lost_events


# --- progress: every round once, in order -------------------------------------------


def test_progress_follows_the_coordinators_barrier_files(tmp_path):
    from airflow_adrq_bench import barrier

    assert not engine.cell_started(tmp_path, 0)
    barrier.arrive(tmp_path, "warm-0", 1)  # a producer: not the coordinator
    assert not engine.cell_started(tmp_path, 0)
    barrier.arrive(tmp_path, "warm-0", 0)
    assert engine.cell_started(tmp_path, 0) and not engine.cell_started(tmp_path, 1)
    # A failed party: every wait ends at once.
    barrier.abort(tmp_path)
    with pytest.raises(barrier.BarrierTimeoutError, match="another benchmark process failed"):
        barrier.wait(tmp_path, "start-0", 0, 2, timeout_s=60)


# --- timeouts clear of PostgreSQL's deadlock_timeout -------------------------------


def test_quick_timeouts_are_above_the_default_deadlock_timeout():
    sizes, notes = config.clear_of_deadlock_timeout(config.QUICK, 1.0)
    assert sizes == config.QUICK and notes == []  # already clear of 1 s
    assert config.QUICK.round_timeout_s >= 5 * 1.0 and config.QUICK.lock_timeout_s >= 3 * 1.0
    assert config.clear_of_deadlock_timeout(config.DEFAULT, 1.0) == (config.DEFAULT, [])


def test_timeouts_are_raised_for_a_slower_deadlock_timeout_unless_given():
    sizes, notes = config.clear_of_deadlock_timeout(config.QUICK, 2.0)
    assert (sizes.round_timeout_s, sizes.lock_timeout_s) == (10.0, 6.0)
    assert notes == [
        "--lock-timeout-s raised from 3 to 6 s (3 x the server's deadlock_timeout of 2 s)",
        "--round-timeout-s raised from 5 to 10 s (5 x the server's deadlock_timeout of 2 s)",
    ]
    given = dataclasses.replace(config.QUICK, round_timeout_s=0.5)
    sizes, notes = config.clear_of_deadlock_timeout(given, 1.0, keep=frozenset({"round_timeout_s"}))
    assert sizes.round_timeout_s == 0.5
    assert notes[0].startswith("warning: --round-timeout-s 0.5 is below 5 s")
    # MySQL/MariaDB and SQLite: nothing to clear.
    assert config.clear_of_deadlock_timeout(given, 0.0) == (given, [])


# --- legends ---------------------------------------------------------------------------


def test_every_table_has_a_legend_of_its_columns_and_marks_the_default_strategy():
    txs = [_tx(i, "committed") for i in range(2) for _ in range(12)]
    raw = _raw([_cell(0, "airflow_3_3", 12), _cell(1, "commit_time", 12)], txs)
    raw["sweeps"] = {
        "postgresql": [
            {"strategy": s, "fanout": 1, "latency_s": 0.01, "statements": 3, "rows_exact": True}
            for s in ("commit_time", "airflow_3_3")
        ]
    }
    raw["raw_sql_ratio"] = {
        "postgresql": [
            {
                "fanout": 1,
                "calls": 5,
                "rows_exact": True,
                "ours_p50_ms": 2.0,
                "ours_p95_ms": 3.0,
                "raw_p50_ms": 1.0,
                "raw_p95_ms": 2.0,
                "ours_statements": 3,
                "raw_statements": 4,
                "ratio_p50": 2.0,
                "ratio_p95": 1.5,
            }
        ]
    }
    rows = report.aggregate(raw)

    table = report.format_table(raw, rows)
    legend = table[table.index("Legend (contention tables)") :]
    for word in (
        "`single`",
        "`multi_outlet`",
        "`with_consumer`",
        "`airflow_3_3`",
        "`sorted_loop`",
        "`values_batch`",
        "`per_call`",
        "`commit_time*`",
        "planned (above the tables):",
        "ok:",
        "gave up:",
        "not started:",
        "deadlocks, other:",
        "retries:",
        "exact:",
        "tx/s:",
        "vs 3.3:",
        "p50 / p99 / max ms",
        "stmts/tx:",
        "SAVEPOINT and RELEASE included, BEGIN not",
        "Why `per_call` can deadlock and `commit_time` cannot",
        "bench-contention.csv",
    ):
        assert word in " ".join(legend.split()), word
    assert "| commit_time* |" in table and "| airflow_3_3  |" in table

    sweep = report.format_sweep(raw)
    assert "| commit_time* |" in sweep
    # Report order, whatever order the sweep ran in.
    assert sweep.index("| airflow_3_3") < sweep.index("| commit_time*")
    assert "Legend (fan-out sweep)" in sweep and "F=N:" in sweep and "skipped:" in sweep

    ratio = " ".join(report.format_ratio(raw).split())
    for word in ("Legend (raw SQL)", "fan-out:", "ratio p50:", "stmts ours/raw", "exact:", "bench-ratio.csv"):
        assert word in ratio, word

    lost_legend = " ".join(report.LOST_LEGEND.split())
    for word in ("hold ms:", "events, not done:", "pairs:", "unconsumed:", "late:", "bench-lost.csv"):
        assert word in lost_legend, word
    assert "runs:" in lost_legend and "passes:" in lost_legend


# --- help -----------------------------------------------------------------------------


def _bench_help():
    bench = cli.bench_parser()
    return bench, bench.format_help()


def test_every_size_option_says_what_it_is_its_default_and_its_quick_value():
    bench, _ = _bench_help()
    by_dest = {a.dest: a for a in bench._actions}
    for field in dataclasses.fields(config.Sizes):
        text = by_dest[field.name].help
        assert text.startswith(field.metadata["help"]), field.name
        assert f"(default {options.show(getattr(config.DEFAULT, field.name))}; " in text, field.name
        assert f"--quick {options.show(getattr(config.QUICK, field.name))})" in text, field.name
    assert by_dest["round_timeout_s"].help.endswith("(default 8; --quick 5)")


def test_help_says_what_db_needs_and_which_strategy_is_the_default():
    bench, text = _bench_help()
    by_dest = {a.dest: a for a in bench._actions}
    db = by_dest["db"].help
    assert "must exist" in db and "never written" in db and "adrq_bench_" in db
    assert "create and drop databases" in db
    strategy = by_dest["strategy"].help
    assert f"{config.DEFAULT_STRATEGY} is the default strategy" in strategy
    assert "per_call" in strategy and "deadlock" in strategy and "one global order" in strategy
    assert by_dest["keep_scratch"].help and "--keep-scratch" in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--sweep", "16,0"], "argument --sweep: sweep must be at least 1, not 16,0"),
        (["--hold-ms", "soon"], "argument --hold-ms: expected a number, not 'soon'"),
        (["--soak", "--producers", "2.5"], "argument --producers: expected an integer, not '2.5'"),
        (["--db", "localhost:5432"], "argument --db: not a SQLAlchemy database URL: 'localhost:5432'"),
        (["--faults", "--producers", "0"], "argument --producers: producers must be at least 1, not 0"),
        (["--soak", "--hold-ms", "-1"], "argument --hold-ms: hold_ms must be at least 0, not -1"),
    ],
)
def test_size_options_are_parsed_and_checked_by_argparse(capsys, argv, said):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["--faults", "--soak"])
def test_faults_and_soak_refuse_a_server_they_do_not_run_on(capsys, mode):
    assert cli.main([mode, "--db", "sqlite://"]) == 4  # could not run
    assert f"error: --db 'sqlite://': {mode} runs on PostgreSQL and MySQL/MariaDB" in capsys.readouterr().err
