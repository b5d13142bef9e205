"""The exit status of ``airflow-adrq bench``: one meaning per code (the table of ``--help``), each tested."""

from __future__ import annotations

import argparse
import importlib.metadata

import pytest

from airflow_adrq_bench import cli, exits, options
from airflow_adrq_bench.exits import Exit
from airflow_adrq_bench.verdict import Line

MET = Line("postgresql", "deadlocks", "0", "0", "met")
MISSED = Line("postgresql", "tx/s single outlet", ">= 1x", "0.50x", "MISSED")
UNCLEAR = Line("postgresql", "tx/s single outlet", ">= 1x", "1.05x (spreads overlap)", "unclear")


def test_the_help_ends_with_the_table_of_every_code():
    text = cli.bench_parser().format_help()
    table = text[text.index("exit status") :]
    for code in Exit:
        assert f"\n  {code.value:<4} " in table, code
    assert "--allow-unclear" in text and max(map(len, table.splitlines())) <= 80


@pytest.mark.parametrize(
    ("problems", "lines", "check", "allow", "status"),
    [
        ([], [MET], False, False, Exit.OK),
        ([], [MET, MISSED, UNCLEAR], False, False, Exit.OK),  # without --check the targets do not count
        (["rows not exact"], [MET], False, False, Exit.MISSED),  # a failed check always does
        ([], [MET, MISSED], True, False, Exit.MISSED),
        ([], [MET, MISSED, UNCLEAR], True, True, Exit.MISSED),  # a miss is a miss, unclear allowed or not
        ([], [MET, UNCLEAR], True, False, Exit.UNCLEAR),
        ([], [MET, UNCLEAR], True, True, Exit.OK),
    ],
)
def test_judge_gives_one_code_per_answer(problems, lines, check, allow, status):
    judged = exits.judge(problems, lines, check=check, allow_unclear=allow)
    assert judged.status == status
    assert bool(judged.reasons) == (status != Exit.OK)


def test_a_usage_error_is_argparses_2(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--quick", "--no-such-option"])
    assert exited.value.code == Exit.USAGE == 2


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # Nothing listens on port 1: the server is unreachable.
        (["--db", "postgresql://root@127.0.0.1:1/postgres"], "port 1 failed: Connection refused"),
        # The URL's driver is not installed.
        (["--db", "postgresql+pg8000://root@127.0.0.1/postgres"], "No module named 'pg8000'"),
        (["--db", "oracle://scott@127.0.0.1/x"], "the benchmark runs on SQLite, PostgreSQL and MySQL"),
        (["--faults", "--db", "sqlite://"], "--faults runs on PostgreSQL and MySQL/MariaDB"),
        (["--soak", "--db", "sqlite://"], "--soak runs on PostgreSQL and MySQL/MariaDB"),
    ],
)
def test_what_cannot_run_exits_4_with_one_line(capsys, tmp_path, argv, said):
    assert cli.main([*argv, "--quick", "--out", str(tmp_path)]) == Exit.COULD_NOT_RUN == 4
    err = capsys.readouterr().err
    assert said in " ".join(err.split()) and "Traceback" not in err
    assert max(map(len, err.splitlines())) <= 100


@pytest.mark.skipif(
    any(importlib.metadata.distributions(name="apache-airflow-core")), reason="Airflow is installed here"
)
@pytest.mark.parametrize("mode", [[], ["--accounting"], ["--live"]])
def test_the_airflow_modes_without_airflow_exit_4(capsys, tmp_path, mode):
    assert cli.main(["--airflow", *mode, "--out", str(tmp_path)]) == Exit.COULD_NOT_RUN
    assert "needs apache-airflow" in capsys.readouterr().err


def _guarded(measure):
    parser = argparse.ArgumentParser(prog="airflow-adrq bench")
    return options.guarded(parser, parser.parse_args([]), measure)


def test_ctrl_c_exits_130_and_a_bug_4_with_its_traceback(capsys):
    def interrupted() -> int:
        raise KeyboardInterrupt

    def buggy() -> int:
        raise ZeroDivisionError("division by zero")

    assert _guarded(interrupted) == Exit.INTERRUPTED == 130
    assert _guarded(buggy) == Exit.COULD_NOT_RUN
    err = capsys.readouterr().err
    assert (
        "interrupted" in err
        and "Traceback" in err
        and "could not run: ZeroDivisionError: division by zero" in err
    )


@pytest.mark.parametrize("mode", [[], ["--faults"], ["--soak"], ["--airflow"], ["--airflow", "--accounting"]])
def test_every_modes_help_ends_with_the_table(capsys, mode):
    with pytest.raises(SystemExit) as exited:
        cli.main([*mode, "--help"])
    assert exited.value.code == 0
    assert exits.EPILOG in capsys.readouterr().out


def test_the_live_modes_help_says_what_fails_it_then_the_table():
    from airflow_adrq_bench.airflow_mode import live

    text = live.build_parser().format_help()
    assert "--allow-unclear" in text and "--expect-stock-worse also" in text and exits.EPILOG in text


def test_the_airflow_modes_end_with_the_status_they_were_judged(tmp_path, capsys):
    """--airflow, --accounting and --live all end in report.conclude: the verdict printed, the files
    written, the reasons said, the status of the judgement returned."""
    from airflow_adrq_bench.airflow_mode import report

    raw = {"duration_s": 1.0}
    judged = exits.judge([], [MET, UNCLEAR], check=True)
    assert report.conclude(tmp_path / "airflow-bench", raw, "detail", [MET, UNCLEAR], judged) == Exit.UNCLEAR
    printed = capsys.readouterr()
    assert "1 met, 0 MISSED, 1 unclear of 2 targets" in printed.out
    assert "ERROR: target unclear: postgresql tx/s single outlet" in printed.err
    assert raw["problems"] == judged.reasons and (tmp_path / "airflow-bench.md").exists()
