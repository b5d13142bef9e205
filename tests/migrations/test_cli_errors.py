"""Every command-line error is one clear message on stderr and a non-zero exit, never a traceback.

``db`` prints it on one line; ``bench`` wraps it at 100 columns, as everything it prints.

``db`` exits 4 when it could not run (:data:`airflow_adrq.cli.EXIT_COULD_NOT_RUN`), 2 on a usage error,
1 only for ``db check``'s finding; ``bench`` uses the same 2 and 4 (``airflow-adrq bench --help``).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_adrq import cli


def _one_line_error(capsys, argv, *, status=cli.EXIT_COULD_NOT_RUN):
    assert cli.main(argv) == status
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 or (argv[0] == "bench" and max(map(len, lines)) <= 100), captured.err
    assert lines[0].startswith("airflow-adrq: error: "), captured.err
    assert "Traceback" not in captured.err and "[SQL:" not in captured.err
    return " ".join(lines)


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "check"], ["bench", "--quick"]])
def test_unsupported_dialect(capsys, command):
    bench = command[0] == "bench"
    line = _one_line_error(
        capsys,
        [*command, "--db" if bench else "--url", "oracle://a@b/c"],
    )
    assert "oracle" in line and ("sqlite" in line.lower())


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "check"], ["doctor"]])
def test_not_a_url_is_a_usage_error_of_that_command(capsys, command):
    """Exit 2 (argparse's usage error), never one of doctor's verdicts (0, 1, 3) or its no-report (4)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--url", "localhost:5432"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: airflow-adrq {' '.join(command)}" in err
    assert "not a SQLAlchemy database URL: 'localhost:5432'" in err


@pytest.mark.backends("postgresql", "mysql")
def test_unreachable_host(capsys, backend):
    url = {
        "postgresql": "postgresql+psycopg2://nobody@127.0.0.1:1/x",
        "mysql": "mysql+mysqldb://nobody@127.0.0.1:1/x",
    }
    line = _one_line_error(capsys, ["db", "upgrade", "--url", url[backend]])
    assert "127.0.0.1" in line or "connect" in line.lower()
    # A sentence on every backend, not MySQLdb's (errno, message) tuple.
    assert not line.removeprefix("airflow-adrq: error: ").startswith("("), line


@pytest.mark.backends("postgresql", "mysql")
def test_missing_database(capsys, backend, server_info):
    url = (
        sa.make_url(server_info.url)
        .set(database="adrq_no_such_database")
        .render_as_string(hide_password=False)
    )
    line = _one_line_error(capsys, ["db", "upgrade", "--url", url])
    assert "adrq_no_such_database" in line


def test_airflow_database(capsys, fresh_db_url):
    engine = sa.create_engine(fresh_db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dag_run (id INTEGER PRIMARY KEY)")
    engine.dispose()
    assert "Apache Airflow's own schema" in _one_line_error(capsys, ["db", "upgrade", "--url", fresh_db_url])


def test_half_built_database(capsys, fresh_db_url):
    engine = sa.create_engine(fresh_db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dag (dag_id VARCHAR(250) PRIMARY KEY)")
    engine.dispose()
    line = _one_line_error(capsys, ["db", "upgrade", "--url", fresh_db_url])
    assert "already has the table(s) dag" in line


@pytest.mark.parametrize(
    "argv",
    [["db", "upgrade", "--url", "sqlite://", "--bogus"], ["bench", "--fanout", "many"], ["nonsense"]],
)
def test_garbage_options_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as excinfo:
        cli.main(argv)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["doctor", "--jso"], "usage: airflow-adrq doctor"),  # no abbreviations: --jso is not --json
        (["doctor", "--fast"], "usage: airflow-adrq doctor"),
        (["db", "check", "--url", "sqlite://", "--fast"], "usage: airflow-adrq db check"),
        (["bench", "--fast"], "usage: airflow-adrq bench"),
        (["bench", "--qui"], "usage: airflow-adrq bench"),  # was taken as --quick
        (["db", "current", "--url", "sqlite://", "--ur", "x"], "usage: airflow-adrq db current"),
        (["--versio"], "usage: airflow-adrq "),  # the top level refuses abbreviations too
    ],
)
def test_an_unknown_option_is_a_usage_error_of_that_command(capsys, argv, usage):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments" in err
