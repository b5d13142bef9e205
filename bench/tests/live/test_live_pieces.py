"""``bench --airflow --live``'s pieces without a deployment: the options, the settings every component
gets, the checks before the first deployment, the DAG files, the access-log parser, the verdict and
the exit-status rules."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
import shutil
import socketserver
import threading

import pytest

from airflow_adrq_bench import verdict
from airflow_adrq_bench.airflow_mode.config import LIVE_DEFAULT as DEFAULT
from airflow_adrq_bench.airflow_mode.config import LIVE_SMALL as SMALL
from airflow_adrq_bench.airflow_mode.config import LiveError, LiveShape, LiveSizes, default_time_limit
from airflow_adrq_bench.airflow_mode.live import (
    build_parser,
    churn,
    deployment,
    driver,
    lock_waits,
    main,
    memory,
    report,
    shape_from,
)
from airflow_adrq_testing import servers
from airflow_adrq_testing.dataset import Target
from airflow_adrq_testing.pytest_plugin import skip_or_fail

POSTGRESQL = Target("postgresql", "postgresql", "postgresql://root@127.0.0.1/postgres", "PostgreSQL 15")
MARIADB = Target("mysql", "mysql", "mysql+mysqldb://root@127.0.0.1/test", "MariaDB 10.11")


# --- options and settings -----------------------------------------------------------------


def _shape(*argv):
    parser = build_parser()
    return shape_from(parser, parser.parse_args(["--airflow", "--live", *argv]))


def test_options_give_the_shape():
    assert _shape() == LiveShape(executor="local", celery_workers=2, pgbouncer=False, api_workers=1)
    shape = _shape(
        *("--executor", "celery", "--celery-workers", "3", "--broker-url", "redis://h:6379/4"),
        *("--pgbouncer", "--api-workers", "2"),
    )
    assert shape == LiveShape("celery", 3, "redis://h:6379/4", True, 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--celery-workers", "2"], "need --executor celery"),
        (["--broker-url", "redis://h/1"], "need --executor celery"),
        (["--executor", "celery", "--celery-workers", "0"], "at least 1"),
        (["--api-workers", "0"], "at least 1"),
        (["--executor", "kubernetes"], "invalid choice"),
        (["--runs", "0"], "at least 1"),
        (["--plugin-kwargs", "[1]"], "not a JSON object"),
        (["--plugin-kwargs", "{"], "not JSON"),
        (["--smal"], "unrecognized arguments: --smal"),  # no abbreviations
    ],
)
def test_usage_errors_exit_2_with_the_live_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--airflow", "--live", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage: airflow-adrq bench --airflow --live" in err


def test_shape_validation():
    for bad in ({"executor": "k8s"}, {"celery_workers": 0}, {"api_workers": 0}, {"broker_url": "redis://h"}):
        with pytest.raises(ValueError):
            LiveShape(**bad)


def _deployment(tmp_path, shape, target=POSTGRESQL):
    made = deployment.Deployment(target, "plugin", SMALL, shape, tmp_path / "logs")
    shutil.rmtree(made.home)  # never entered: only its settings are looked at
    made.env = made._settings("postgresql+psycopg2://root@127.0.0.1:5432/adrq_live_x")
    return made


def test_celery_settings_give_each_deployment_its_own_broker_database_and_queue(tmp_path):
    shape = LiveShape(executor="celery", celery_workers=3, api_workers=2)
    first, second = (_deployment(tmp_path, shape) for _ in range(2))
    env = first.env
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CORE__ASSET_MANAGER_CLASS"] == "airflow_adrq.airflow.AdrqAssetManager"
    # The explicit driver: SQLAlchemy 2.1 would map postgresql:// to psycopg 3.
    assert (
        env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+postgresql+psycopg2://root@127.0.0.1:5432/adrq_live_x"
    )
    # 8 producer tasks per burst on 3 workers: 3 each, so a burst runs at once.
    assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "3"
    assert env["AIRFLOW__API__WORKERS"] == "2"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith(deployment.DEFAULT_REDIS + "/")
    assert env["AIRFLOW__CELERY__BROKER_URL"] != second.env["AIRFLOW__CELERY__BROKER_URL"]
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] != second.env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"]
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC" not in env
    assert first.shape_info == {
        "executor": "CeleryExecutor",
        "celery_workers": 3,
        "broker_url": env["AIRFLOW__CELERY__BROKER_URL"],
        "pgbouncer": False,
        "schedulers": 1,
        "api_workers": 2,
        "reparse_s": 0,
        "pause_churn": False,
    }
    local = _deployment(tmp_path, LiveShape()).env
    assert local["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert not [k for k in local if k.startswith("AIRFLOW__CELERY__")]
    assert _deployment(tmp_path, LiveShape(), MARIADB).schedulers == 1


def test_pgbouncer_settings_make_asyncpg_safe_behind_transaction_pooling(tmp_path):
    env = _deployment(tmp_path, LiveShape(pgbouncer=True)).env
    module, _, name = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"].rpartition(".")
    args = getattr(importlib.import_module(module), name)  # what Airflow's conf.getimport does
    assert args["statement_cache_size"] == 0 and args["prepared_statement_cache_size"] == 0
    assert len({args["prepared_statement_name_func"]() for _ in range(3)}) == 3


def test_report_names_the_shape(tmp_path):
    info = _deployment(tmp_path, LiveShape(executor="celery", pgbouncer=True)).shape_info
    assert report.shape_label({**info, "schedulers": 2}) == (
        "CeleryExecutor, 2 Celery workers, PgBouncer (transaction pooling), 2 schedulers, 1 api-server worker"
    )
    local = _deployment(tmp_path, LiveShape()).shape_info
    assert report.shape_label(local) == "LocalExecutor, direct, 1 scheduler, 1 api-server worker"


def test_default_time_limit_grows_with_the_burst():
    small, big = default_time_limit(SMALL), default_time_limit(DEFAULT)
    assert 300 < small < big
    assert default_time_limit(LiveSizes(producer_dags=4)) > big


# --- the checks before the first deployment -------------------------------------------------


@contextlib.contextmanager
def _fake_redis(answer):
    """A TCP server that answers every command with ``answer``; its URL (password ``secret``)."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            while self.request.recv(512):
                self.request.sendall(answer)

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"redis://:secret@127.0.0.1:{server.server_address[1]}/3"
        finally:
            server.shutdown()


def test_unreachable_broker_is_a_clear_error_before_any_deployment():
    url = f"redis://127.0.0.1:{servers.free_port()}/1"
    with pytest.raises(LiveError, match=r"broker redis://127\.0\.0\.1:\d+/1 does not answer .*redis-server"):
        deployment.check(LiveShape(executor="celery", broker_url=url), [POSTGRESQL])


def test_broker_must_accept_the_connection_as_celery_makes_it():
    with _fake_redis(b"-NOAUTH Authentication required.\r\n") as url, pytest.raises(LiveError) as raised:
        deployment.check_celery(url)
    assert "Authentication required" in str(raised.value) and "secret" not in str(raised.value)


def test_missing_celery_names_the_install_command():
    with pytest.raises(LiveError) as raised:
        deployment.check_celery("redis://127.0.0.1:6379/0", "adrq_no_such_module_here")
    assert deployment.CELERY_INSTALL in str(raised.value) and "ModuleNotFoundError" in str(raised.value)


def test_missing_pgbouncer_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(servers.ENV_PGBOUNCER, raising=False)
    monkeypatch.setattr(servers.shutil, "which", lambda *a, **k: None)
    with pytest.raises(
        LiveError, match="--pgbouncer: no pgbouncer binary: install the Debian package 'pgbouncer'"
    ):
        deployment.check(LiveShape(pgbouncer=True), [POSTGRESQL])


def test_pgbouncer_is_refused_with_mysql():
    with pytest.raises(LiveError, match=r"PostgreSQL only .* not mysql: add --backend postgresql"):
        deployment.check(LiveShape(pgbouncer=True), [POSTGRESQL, MARIADB])


def test_throwaway_redis_answers_and_is_gone_after():
    if shutil.which("redis-server") is None:
        skip_or_fail("no redis-server (Debian package redis-server)")
    with servers.redis() as url:
        deployment.check_celery(f"{url}/1")
    with pytest.raises(LiveError, match="does not answer"):
        deployment.check_celery(f"{url}/1")


# --- the DAG files --------------------------------------------------------------------------


def _settings(path):
    return json.loads(path.read_text().split("SETTINGS = json.loads(", 1)[1].split(")\n", 1)[0][1:-1])


def test_dag_files_compile_and_name_the_configured_dags(tmp_path):
    sizes = LiveSizes(instances=3, outlets=2, consumers=5, producer_dags=2)
    paths = deployment.write_dag_files(tmp_path / "dags", tmp_path / "barrier", sizes)
    assert [p.name for p in paths] == [deployment.PRODUCERS_FILE, deployment.CONSUMERS_FILE]
    for path in paths:
        compile(path.read_text(), str(path), "exec")
    producers, consumers = map(_settings, paths)
    assert list(producers["outlets"]) == sizes.producer_ids
    assert producers["expected"] == 6  # every instance of every producer DAG meets at the barrier
    assert consumers["dag_ids"][-1] == "adrq_live_consumer_004" and consumers["assets"] == ["a0", "a1"]


def test_own_assets_give_each_producer_its_outlets_and_half_the_consumers_the_and(tmp_path):
    sizes = LiveSizes(instances=3, outlets=2, consumers=4, producer_dags=2, own_assets=True)
    assert sizes.assets == ["p0a0", "p0a1", "p1a0", "p1a1"]
    assert sizes.all_of_ids == sizes.consumer_ids[2:]
    producers, consumers = map(
        _settings, deployment.write_dag_files(tmp_path / "dags", tmp_path / "b", sizes)
    )
    assert producers["outlets"] == {
        "adrq_live_producer_0": ["p0a0", "p0a1"],
        "adrq_live_producer_1": ["p1a0", "p1a1"],
    }
    assert consumers["all_of"] == ["adrq_live_consumer_002", "adrq_live_consumer_003"]


# --- what is counted ------------------------------------------------------------------------

_ACCESS = (
    "2026-12-01T07:55:34.464448Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36226 duration_us=1228245 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099-dfb2-7477-a471-3b04240cd413/state query= status_code=204\n"
    "2026-12-01T07:55:30.764984Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36216 duration_us=9652333 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099-dfb1-792b-88a6-ff8f05633131/run query= status_code=200\n"
    "2026-12-01T07:55:35.000000Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36227 duration_us=2000 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099dfb37006bbdc96d8d8765c29/state query= status_code=409\n"
)


def test_access_log_gives_the_state_calls_with_their_durations(tmp_path):
    log = tmp_path / "api-server.log"
    log.write_text(_ACCESS)
    records = driver.parse_access_log(log)
    assert [(r.ti_id, r.status, r.duration_ms) for r in records] == [
        ("01a23099dfb27477a4713b04240cd413", 204, 1228.245),
        ("01a23099dfb37006bbdc96d8d8765c29", 409, 2.0),
    ]
    assert records[0].at.isoformat() == "2026-12-01T07:55:34.464448+00:00"
    summary = driver.latency_summary(records, ["01a23099dfb27477a4713b04240cd413"])
    assert (summary["calls"], summary["p50_ms"], summary["status"]) == (1, 1228.245, {"204": 1})


def _finished(at, us, method, path):
    """An access-log line of a request answered at ``at`` (UTC, no zone) after ``us`` microseconds."""
    return (
        f"{at}Z [info     ] request finished               [http.access] client_addr=127.0.0.1:1 "
        f"duration_us={us} loc=http_access_log.py:130 method={method} path={path} query= status_code=204\n"
    )


def test_requests_in_flight_count_from_arrival_to_answer_during_the_bursts(tmp_path):
    state = "/execution/task-instances/01a23099dfb37006bbdc96d8d8765c29/state"
    beat = "/execution/task-instances/01a23099dfb37006bbdc96d8d8765c29/heartbeat"
    log = tmp_path / "api-server.log"
    log.write_text(
        _finished("2026-12-01T07:55:10.000000", 500000, "PATCH", state)  # before the first trigger
        + _finished("2026-12-01T07:55:21.000000", 1000000, "PATCH", state)  # 20.0-21.0
        + _finished("2026-12-01T07:55:21.500000", 1000000, "PATCH", state)  # 20.5-21.5
        + _finished("2026-12-01T07:55:20.800000", 200000, "PUT", beat)  # 20.6-20.8
        + _finished("2026-12-01T07:55:22.000000", 500000, "PATCH", state)  # 21.5-22.0: as one ends
        + _finished("2026-12-01T07:55:40.000000", 100000, "PATCH", state)  # after the last burst
    )
    bursts = [
        {"triggered_at": "2026-12-01T07:55:15+00:00", "last_state_call_at": "2026-12-01T07:55:19+00:00"},
        {"triggered_at": "2026-12-01T07:55:19+00:00", "last_state_call_at": "2026-12-01T07:55:22+00:00"},
    ]
    assert driver.in_flight(log, bursts) == {"all": 3, "patch_state": 2}
    unanswered = [{**bursts[0], "last_state_call_at": None}]
    assert driver.in_flight(log, unanswered) == {"all": None, "patch_state": None}


def test_memory_summary_gives_the_sums_peak_per_burst_and_each_process(tmp_path):
    mb = 1024 * 1024
    samples = memory.Samples()
    samples.processes = {10: memory.Process("airflow api_server --"), 11: memory.Process("spawn_main")}
    samples.marks.append(("burst00", 0))
    samples.add(1.0, [(10, 100 * mb, 2), (11, 200 * mb, 5)])
    samples.add(1.1, [(10, 100 * mb, 2), (11, 260 * mb, 9)])
    samples.marks.append(("burst01", 2))
    samples.add(1.2, [(10, 110 * mb, 2), (11, 230 * mb, 7)])
    samples.add(1.3, [(10, 101 * mb, 2)])  # the worker gone
    samples.processes[10].hwm = 120 * mb
    samples.connections += [3, 9]
    summary = memory.summarize(samples, 10)
    assert (summary["before_mb"], summary["peak_mb"], summary["peak_at_s"]) == (300.0, 360.0, 0.1)
    assert summary["per_mark"] == {"burst00": 360.0, "burst01": 340.0}
    assert (summary["threads_before"], summary["threads_max"]) == (7, 11)
    assert (summary["db_connections_before"], summary["db_connections_max"]) == (3, 9)
    assert summary["hwm_sum_mb"] == 120.0 and summary["interval_ms"] == {"p50": 100.0, "max": 100.0}
    shown = [(p["pid"], p["peak_rss_mb"], p["hwm_mb"], p["peak_threads"]) for p in summary["processes"]]
    assert shown == [(10, 110.0, 120.0, 2), (11, 260.0, None, 9)]
    rows = dict(report.ROWS)
    cell = {"api_server_memory": summary, "in_flight": {"all": 5, "patch_state": 3}}
    assert rows["api-server RSS, sum of its processes: before the bursts / peak, MB"](cell) == (
        "300 / 360 (2 processes; at 0 s)"
    )
    assert rows["the same, peak per burst, MB"](cell) == "360, 340"
    assert rows["api-server peak per process: sampled RSS / VmHWM, MB"](cell) == "110 / 120, 260 / -"
    assert rows["api-server requests in flight, most at once: all / PATCH .../state"](cell) == "5 / 3"
    assert rows["api-server database connections: before the bursts / most"](cell) == "3 / 9"
    assert rows["memory samples during the bursts"](
        {"api_server_memory": memory.summarize(memory.Samples(), 1)}
    ) == ("not sampled")


def test_a_failed_deployment_still_shows_the_api_servers_memory_up_to_the_failure():
    mb = 1024 * 1024
    samples = memory.Samples(processes={10: memory.Process("airflow api_server --")})
    samples.marks.append(("burst00", 0))
    samples.add(1.0, [(10, 300 * mb, 50)])
    samples.add(1.1, [(10, 500 * mb, 69)])
    shape = {"executor": "CeleryExecutor", "celery_workers": 2, "pgbouncer": True, "schedulers": 2}
    shape |= {"api_workers": 1, "reparse_s": 0}
    failed = {"error": "POST /api/v2/dags/x/dagRuns: HTTP 500", "log_dir": "logs", "shape": shape}
    cells = [
        _cell("stock", api_server_memory=memory.summarize(samples, 10), **failed),
        _cell("plugin", **failed),
    ]
    sizes = {"producer_dags": 1, "instances": 8, "outlets": 2, "consumers": 8, "bursts": 2, "spread_s": 0.3}
    raw = {"sizes": {**sizes, "own_assets": False}, "cells": cells, "runs": 1, "cpus": 2}
    raw |= {"plugin_source": "here", "plugin_kwargs": None, "load_average": {"start": [1.0]}}
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:4]]
        for line in report.format_tables(raw).splitlines()
        if line.startswith("| ")
    }
    assert rows["api-server RSS, sum of its processes: before the bursts / peak, MB"] == [
        "300 / 500 (1 process; at 0 s)",
        "not sampled",
    ]
    assert rows["api-server threads: before the bursts / most at once"] == ["50 / 69", "not sampled"]
    assert rows["producer tasks failed"] == rows["PATCH .../state p50 / p99 / max ms"] == ["error", "error"]


def test_deadlock_lines_match_both_servers_messages(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "psycopg2.errors.DeadlockDetected: deadlock detected\n"
        "MySQLdb.OperationalError: (1213, 'Deadlock found when trying to get lock')\n"
        "duration_us=1213 status_code=204\n"
        "all fine\n"
    )
    assert driver.deadlock_lines([log]) == {str(log): 2}


# --- the verdict and the exit status ----------------------------------------------------------


def _cell(manager, p50=100.0, **changes):
    cell = {
        "db": "postgresql",
        "version": "PostgreSQL 15",
        "manager": manager,
        "run": 1,
        "error": None,
        "plugin_start_up": "sorted by (asset_id, dag_id), on_conflict=auto",
        "tasks": {"tasks": 8, "failed": 0, "retried": 0},
        "deadlocks": {
            "server": 0,
            "server_scope": "database",
            "latest_names_database": None,
            "log_lines_components": 0,
            "log_lines_tasks": 0,
        },
        "events": {"written": {"burst00": 16, "burst01": 16}, "expected": 32},
        "after_bursts": {"pairs": 256, "stranded": 0, "consumed_twice": 0, "queue_rows": 0},
        "after_extra": {"pairs": 256, "stranded": 0, "consumed_twice": 0, "queue_rows": 0},
        "patch_state": {
            "calls": 8,
            "status": {"204": 8},
            "p25_ms": p50 * 0.9,
            "p50_ms": p50,
            "p75_ms": p50 * 1.1,
            "p99_ms": p50 * 2,
            "max_ms": p50 * 3,
        },
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        cell[section] = {**cell[section], field: value} if field else value
    return cell


def _problems(cells, **flags):
    return report.problems(cells, report.verdict_lines(cells), **flags)


def test_verdict_judges_the_plugin_against_each_target_with_stock_beside():
    lines = report.verdict_lines([_cell("stock", 400.0, tasks__failed=3), _cell("plugin")])
    targets = [report.FAILED, report.SERVER_ERRORS, report.DEADLOCKS, report.EXACT, report.STRANDED]
    targets += [report.LOST, report.TWICE, report.P99, report.SPEED]
    assert [(ln.what, ln.verdict) for ln in lines] == [(target.what, "met") for target in targets]
    assert lines[0].measured == "0 of 8 (stock 3)" and lines[-1].measured.startswith("0.25x")
    assert (lines[4].goal, lines[4].measured) == ("<= 0", "0 of 256 (stock 0)")
    text = verdict.format_verdict(lines)
    assert max(map(len, text.splitlines())) <= 100, text


def test_speed_is_no_ratio_without_a_completed_stock_and_unclear_where_the_spreads_overlap():
    alone = report.verdict_lines([_cell("stock", error="time limit"), _cell("plugin")])[-1]
    assert (alone.verdict, alone.measured) == ("n/a", "no stock to compare")
    close = report.verdict_lines([_cell("stock", 100.0), _cell("plugin", 105.0)])[-1]
    assert close.verdict == "unclear" and "spreads overlap" in close.measured
    slower = [_cell("stock", 100.0), _cell("plugin", 300.0)]
    assert report.verdict_lines(slower)[-1].verdict == "MISSED"
    assert _problems(slower) == []  # the speed target fails the run with --check only
    p99, missed = _problems(slower, check=True)  # p50 and p99 both 3x stock's
    assert p99.startswith("postgresql: PATCH .../state p99 vs stock: 600 vs 200 ms: 3.00x")
    assert missed.startswith("postgresql: PATCH .../state p50 vs stock: 3.00x") and missed.endswith(
        "(target <= 1x)"
    )


def test_exit_status_rules():
    clean = [_cell("stock"), _cell("plugin")]
    assert _problems(clean) == []
    assert _problems(clean, expect_stock_worse=True)  # stock was not worse: fails
    assert _problems([_cell("stock", tasks__failed=3), _cell("plugin")], expect_stock_worse=True) == []
    # Stock's own failures never fail the run; the plug-in's always do.
    assert _problems([_cell("stock", after_bursts__stranded=9), _cell("plugin")]) == []
    for change in (
        {"tasks__failed": 1},
        {"deadlocks__server": 1},
        {"deadlocks__log_lines_tasks": 2},
        {"after_bursts__stranded": 1},
        {"after_extra__stranded": 1},
        {"after_extra__consumed_twice": 1},
        {"after_extra__queue_rows": 1},
        {"events__written": {"burst00": 16, "burst01": 15}},
        {"patch_state__status": {"204": 8, "500": 1}},
        {"error": "time limit"},
    ):
        assert _problems([_cell("stock"), _cell("plugin", **change)]), change
    # MariaDB's counter is server-wide: it fails the plug-in only when the latest deadlock is ours.
    mariadb = {
        **_cell("plugin")["deadlocks"],
        "server": 2,
        "server_scope": "server",
        "latest_names_database": False,
    }
    assert _problems([_cell("plugin", deadlocks=mariadb)]) == []
    assert _problems([_cell("plugin", deadlocks={**mariadb, "latest_names_database": True})])


def test_stranded_pairs_allowed_follow_the_plugins_policy_and_backend():
    def cell(version, policy):
        return _cell(
            "plugin", version=version, plugin_start_up=f"... on_conflict={policy}", after_bursts__stranded=9
        )

    assert report.plugin_policy(cell("MariaDB 10.11", "refresh_after_commit")) == "refresh_after_commit"
    assert report.plugin_policy({"plugin_start_up": None}) == "auto"
    assert report.stranded_allowed(cell("PostgreSQL 15.20", "auto")) == 0
    assert report.stranded_allowed(cell("MariaDB 10.11", "auto")) == 256  # by design, not a miss
    assert report.stranded_allowed(cell("MariaDB 10.11", "refresh_after_commit")) == 256
    assert report.stranded_allowed(cell("MariaDB 10.11", "refresh")) == 0
    assert report.stranded_allowed(cell("PostgreSQL 15.20", "ignore")) == 256
    assert _problems([cell("MariaDB 10.11", "auto")]) == []
    assert _problems([cell("PostgreSQL 15.20", "auto")])


def test_verdict_fits_100_columns_at_the_default_size():
    big = {"after_bursts__pairs": 49152, "after_bursts__stranded": 12096, "after_extra__pairs": 49152}
    big |= {"api_server_memory": {"samples": 9000, "peak_mb": 12345.0}}  # #66853's lines too
    # The plug-in's p50 / p99 at 0.4x stock's: every target met (a missed one is named in the summary).
    cells = [
        _cell(m, p50, db="postgresql", version="MariaDB 10.11", **big)
        for m, p50 in (("stock", 100.0), ("plugin", 40.0))
    ]
    text = verdict.format_verdict(report.verdict_lines(cells))
    assert "12096 of 49152 (stock 12096)" in text and max(map(len, text.splitlines())) <= 100, text
    assert report.MEMORY.what in text and report.P99_BURST.what in text


# --- the pause churn and the lock sampler --------------------------------------------------------


def test_pause_churn_is_an_option_of_the_shape():
    assert _shape().pause_churn is False and _shape("--pause-churn").pause_churn is True
    assert report.shape_label(
        {**_shape("--pause-churn").__dict__, "celery_workers": 0, "schedulers": 2}
    ).endswith("REST pause churn")


def test_churn_toggles_the_last_consumer_of_every_8():
    assert churn.toggled(SMALL.consumer_ids) == ["adrq_live_consumer_007"]
    assert churn.toggled(DEFAULT.consumer_ids) == [f"adrq_live_consumer_{i:03d}" for i in range(7, 64, 8)]
    assert churn.toggled(["a", "b", "c"]) == ["c"]  # fewer than 8: the last one


def test_churn_summary_counts_every_request_and_its_answers():
    calls = [churn.Call("bulk", 200, 30.0), churn.Call("bulk", 500, 90.0), churn.Call("pause", 200, 10.0)]
    calls += [churn.Call("unpause", 0, 60000.0)]  # no answer
    summary = churn.summarize(calls)
    assert (summary["calls"], summary["not_2xx"], summary["5xx"]) == (4, 2, 1)
    assert (summary["p50_ms"], summary["p99_ms"], summary["max_ms"]) == (30.0, 60000.0, 60000.0)
    assert summary["status"] == {"0": 1, "200": 2, "500": 1}
    assert summary["kinds"]["bulk"] == {
        "calls": 2, "not_2xx": 1, "5xx": 1, "p50_ms": 30.0, "p99_ms": 90.0, "max_ms": 90.0,
        "status": {"200": 1, "500": 1},
    }  # fmt: skip
    assert churn.summarize([])["calls"] == 0


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
WAIT_SQL = "SELECT dag.dag_id FROM dag WHERE dag.dag_id = 'adrq_live_consumer_003' FOR SHARE OF dag"


def _at(ms):
    return T0 + dt.timedelta(milliseconds=ms)


def _row(at, pid, xact, query, *, waiting_since=None, blockers=None):
    """A row of lock_waits.SAMPLE: at, pid, xact_start, query_start, waiting, blocking pids, query."""
    since = _at(waiting_since if waiting_since is not None else at)
    return (_at(at), pid, _at(xact), since, waiting_since is not None, blockers, query)


def test_samples_match_each_producer_wait_with_the_transactions_it_waited_for():
    samples = lock_waits.Samples()
    # The producer (pid 1) queued at 100 ms behind the DAG processor (2), which waits for the bulk
    # UPDATE (3, open since 0 ms): the producer waits for both, through the DAG processor's tuple lock.
    processor, bulk = "SELECT dag.dag_id ... FOR NO KEY UPDATE", "UPDATE dag SET is_paused=false"
    for t in (150, 200, 250):
        samples.add(
            [
                _row(t, 1, 90, WAIT_SQL, waiting_since=100, blockers=[2]),
                _row(t, 2, 50, processor, waiting_since=60, blockers=[3]),
                _row(t, 3, 0, bulk),
            ],
            t / 1000,
        )
    samples.add([_row(300, 3, 0, bulk)], 0.3)  # the waiters are through; the bulk is still open
    samples.add([], 0.35)
    summary = lock_waits.summarize(samples)
    assert summary["samples"] == 5 and summary["interval_ms"] == {"p50": 50.0, "max": 50.0}
    assert (summary["producer_waits"], summary["producer_wait_max_ms"], summary["holder_max_ms"]) == (
        1,
        150,
        300,
    )
    assert summary["excess_max_ms"] == -150.0 and summary["worst"]["holder"] == bulk
    assert summary["by_holder"] == {"pause churn": {"waits": 1, "wait_max_ms": 150, "holder_max_ms": 300}}
    assert (summary["writes"], summary["write_wait_max_ms"], summary["write_excess_max_ms"]) == (1, 150, -150)
    # The DAG processor's wait is another backend's: counted, not judged.
    assert (summary["other_waits"], summary["other_wait_max_ms"], summary["other_longest"]) == (
        1,
        190,
        processor,
    )


def test_a_producer_waiting_beyond_its_holder_shows_the_excess():
    samples = lock_waits.Samples()
    samples.add(
        [_row(100, 1, 0, WAIT_SQL, waiting_since=0, blockers=[2]), _row(100, 2, 50, "UPDATE dag")], 0.1
    )
    samples.add([_row(400, 1, 0, WAIT_SQL, waiting_since=0, blockers=[])], 0.4)  # the holder went unseen
    # A second wait of the same queue write, for another row, held 100 ms.
    samples.add(
        [_row(600, 1, 0, WAIT_SQL, waiting_since=500, blockers=[3]), _row(600, 3, 500, "UPDATE")], 0.6
    )
    summary = lock_waits.summarize(samples)
    waits = (summary["producer_wait_max_ms"], summary["holder_max_ms"], summary["excess_max_ms"])
    assert waits == (400, 100, 350)
    writes = (summary["writes"], summary["write_wait_max_ms"], summary["write_excess_max_ms"])
    assert writes == (1, 500, 400)
    assert summary["by_holder"]["other"] == {"waits": 2, "wait_max_ms": 400, "holder_max_ms": 100}
    # The plug-in's NOWAIT / SKIP LOCKED statements never wait; stock's producers are not matched.
    for query in (WAIT_SQL + " NOWAIT", WAIT_SQL + " SKIP LOCKED", "INSERT INTO asset_dag_run_queue ..."):
        assert not lock_waits.PRODUCER_WAIT.search(query)
    assert lock_waits.summarize(lock_waits.Samples())["interval_ms"] == {"p50": None, "max": None}


def _sampled(excess, waits=3, holder=800.0):
    return {
        "samples": 100, "interval_ms": {"p50": 51.0, "max": 70.0}, "producer_waits": waits,
        "producer_wait_max_ms": holder + excess, "holder_max_ms": holder, "excess_max_ms": excess,
        "worst": None, "writes": 2, "write_wait_max_ms": None, "write_excess_max_ms": 10.0,
        "other_waits": 0, "other_wait_max_ms": None, "other_longest": None, "error": None,
    }  # fmt: skip


def test_verdict_judges_the_churn_and_the_waits_where_measured():
    summary = {"calls": 30, "not_2xx": 1, "5xx": 1, "p50_ms": 20.0, "p99_ms": 80.0, "max_ms": 90.0}
    busy = {**summary, "kinds": {"bulk": {"calls": 10}, "pause": {"calls": 10}, "unpause": {"calls": 10}}}
    cells = [_cell("stock", churn=busy), _cell("plugin", churn=busy, lock_waits=_sampled(120.0))]
    lines = {ln.what: ln for ln in report.verdict_lines(cells)}
    assert lines[report.CHURN_ERRORS.what].verdict == "MISSED"
    assert (lines[report.WAIT.what].verdict, lines[report.WAIT.what].measured) == (
        "MISSED",
        "120 ms (3 waits; longest holder 800 ms)",
    )
    assert len(_problems(cells)) == 2
    cells[1] |= {"churn": {**busy, "5xx": 0}, "lock_waits": _sampled(40.0)}
    assert _problems(cells) == []
    rows = dict(report.ROWS)
    shown = [rows[label](cells[1]) for label in rows if callable(rows[label]) and "ms" in label]
    assert "30 (20 / 10), 1 not 2xx, 0 5xx; 20 / 80 / 90 ms" in shown and "40 (3 waits)" in shown
    assert "100 / 200 / 300 (8 calls, 0 not 2xx)" in shown
    assert rows["worst producer wait beyond its longest holder, ms"](cells[0]) == "not sampled"


def test_p99_target_is_1x_where_stock_deadlocked_else_2x_and_judged_with_check_only():
    calm = [_cell("stock", 100.0), _cell("plugin", 150.0)]  # p99 200 vs 300 ms: 1.5x
    (p99,) = [ln for ln in report.verdict_lines(calm) if ln.what == report.P99.what]
    assert (p99.goal, p99.verdict, p99.measured) == ("<= 2x", "met", "300 vs 200 ms: 1.50x")
    stormy = [_cell("stock", 100.0, deadlocks__server=2), _cell("plugin", 150.0)]
    (p99,) = [ln for ln in report.verdict_lines(stormy) if ln.what == report.P99.what]
    assert (p99.goal, p99.verdict) == ("<= 1x", "MISSED")
    assert _problems(stormy) == [] and len(_problems(stormy, check=True)) == 2  # with the p50's


def test_verdict_judges_66853s_targets_where_the_memory_was_sampled():
    def cells(plugin_p50, plugin_peak):
        stock = _cell("stock", 100.0, api_server_memory={"samples": 50, "peak_mb": 800.0})
        return [stock, _cell("plugin", plugin_p50, api_server_memory={"samples": 50, "peak_mb": plugin_peak})]

    lines = {ln.what: ln for ln in report.verdict_lines(cells(40.0, 780.0))}
    memory_line, p99 = lines[report.MEMORY.what], lines[report.P99_BURST.what]
    assert (memory_line.goal, memory_line.verdict, memory_line.measured) == (
        "<= 1x",
        "met",
        "780 vs 800 MB: 0.97x",
    )
    assert (p99.goal, p99.verdict, p99.measured) == ("<= 0.5x", "met", "80 vs 200 ms: 0.40x")
    worse = cells(60.0, 900.0)  # p99 120 vs 200 ms: within 2x, not within 0.5x
    lines = {ln.what: ln for ln in report.verdict_lines(worse)}
    assert lines[report.MEMORY.what].verdict == lines[report.P99_BURST.what].verdict == "MISSED"
    assert lines[report.P99.what].verdict == "met"
    assert _problems(worse) == [] and len(_problems(worse, check=True)) == 2  # judged with --check only
    alone = {ln.what: ln for ln in report.verdict_lines(worse[1:])}
    assert alone[report.MEMORY.what].verdict == "n/a" and "no stock" in alone[report.MEMORY.what].measured
    # Cells of a run before the sampler (no api_server_memory): no such lines.
    assert report.MEMORY.what not in {
        ln.what for ln in report.verdict_lines([_cell("stock"), _cell("plugin")])
    }


def test_holders_are_named_by_the_statements_seen():
    assert lock_waits.kind_of(
        ["SELECT dag.dag_id FROM dag WHERE ... FOR NO KEY UPDATE", "UPDATE dag SET x"]
    ) == ("DAG processor")
    assert lock_waits.kind_of(["SELECT 1", "DELETE FROM asset_dag_run_queue WHERE ..."]) == "scheduler"
    assert lock_waits.kind_of(["UPDATE dag SET is_paused=false WHERE dag.dag_id IN (...)"]) == "pause churn"
    assert lock_waits.kind_of(["INSERT INTO asset_event (asset_id) VALUES (1)"]) == "producer"
    assert lock_waits.kind_of(["SELECT 1"]) == lock_waits.kind_of([]) == "other"
