"""``bench --airflow --live``'s deployment shapes without a deployment: the options, the settings
every component gets, the report's naming, and the clear errors before the first deployment."""

from __future__ import annotations

import contextlib
import importlib
import shutil
import socket
import socketserver
import threading

import pytest

from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.live import build_parser, main, report, scaleout, shape_from
from airflow_adrq_bench.airflow_mode.live.config import MANAGER_CLASSES, SMALL, LiveError, LiveShape
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment
from airflow_adrq_testing import servers
from tests.support.ci import skip_or_fail

POSTGRESQL = run_module.Target(
    "postgresql", "postgresql", "postgresql://root@127.0.0.1/postgres", "PostgreSQL 15"
)
MARIADB = run_module.Target("mysql", "mysql", "mysql+mysqldb://root@127.0.0.1/test", "MariaDB 10.11")


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
    ],
)
def test_contradicting_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--airflow", "--live", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_shape_validation():
    for bad in ({"executor": "k8s"}, {"celery_workers": 0}, {"api_workers": 0}, {"broker_url": "redis://h"}):
        with pytest.raises(ValueError):
            LiveShape(**bad)


def _deployment(tmp_path, shape, backend="postgresql"):
    url = "postgresql+psycopg2://root@127.0.0.1:5432/adrq_live_x"
    return Deployment(
        name="t",
        backend=backend,
        url=url,
        manager_class=MANAGER_CLASSES["plugin"],
        sizes=SMALL,
        home=tmp_path / "home",
        log_dir=tmp_path / "logs",
        shape=shape,
        server_url="postgresql://root@127.0.0.1:5432/postgres",
    )


def test_celery_settings_give_each_deployment_its_own_broker_database_and_queue(tmp_path):
    shape = LiveShape(executor="celery", celery_workers=3, api_workers=2)
    first, second = (_deployment(tmp_path, shape) for _ in range(2))
    env = first.env
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    # The explicit driver: SQLAlchemy 2.1 would map postgresql:// to psycopg 3.
    assert (
        env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+postgresql+psycopg2://root@127.0.0.1:5432/adrq_live_x"
    )
    # 8 producer tasks per burst on 3 workers: 3 each, so a burst runs at once.
    assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "3"
    assert env["AIRFLOW__API__WORKERS"] == "2"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith(scaleout.DEFAULT_REDIS + "/")
    assert env["AIRFLOW__CELERY__BROKER_URL"] != second.env["AIRFLOW__CELERY__BROKER_URL"]
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] != second.env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"]
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC" not in env
    assert first.shape_info == {
        "executor": "CeleryExecutor",
        "celery_workers": 3,
        "pgbouncer": False,
        "schedulers": 1,
        "api_workers": 2,
        "reparse_s": 0,
        "broker_url": env["AIRFLOW__CELERY__BROKER_URL"],
    }
    local = _deployment(tmp_path, LiveShape()).env
    assert local["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert not [k for k in local if k.startswith("AIRFLOW__CELERY__")]


def test_pgbouncer_settings_make_asyncpg_safe_behind_transaction_pooling(tmp_path):
    env = _deployment(tmp_path, LiveShape(pgbouncer=True)).env
    path = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"]
    module, _, name = path.rpartition(".")
    args = getattr(importlib.import_module(module), name)  # what Airflow's conf.getimport does
    assert args["statement_cache_size"] == 0 and args["prepared_statement_cache_size"] == 0
    names = {args["prepared_statement_name_func"]() for _ in range(3)}
    assert len(names) == 3


def test_report_names_the_shape():
    shape = LiveShape(executor="celery", pgbouncer=True)
    assert report.shape_label(shape.describe(2)) == (
        "CeleryExecutor, 2 Celery workers, PgBouncer (transaction pooling), 2 schedulers, 1 api-server worker"
    )
    assert (
        report.shape_label(LiveShape().describe(1))
        == "LocalExecutor, direct, 1 scheduler, 1 api-server worker"
    )
    cell = {
        "db": "postgresql",
        "version": "PostgreSQL 15",
        "manager": "stock",
        "run": 1,
        "error": "x",
        "shape": shape.describe(2),
    }
    raw = {"sizes": {**SMALL.__dict__}, "cells": [cell], "duration_s": 1.0}
    assert (
        "### postgresql: PostgreSQL 15; CeleryExecutor, 2 Celery workers, PgBouncer"
        in report.format_tables(raw)
    )


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_broker_is_a_clear_error_before_any_deployment():
    url = f"redis://127.0.0.1:{_closed_port()}/1"
    shape = LiveShape(executor="celery", broker_url=url)
    with pytest.raises(LiveError, match=r"broker redis://127\.0\.0\.1:\d+/1 is unreachable .*redis-server"):
        scaleout.check(shape, [POSTGRESQL])


@contextlib.contextmanager
def _fake_redis(answer):
    """A TCP server that answers every command with ``answer``."""

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


def test_broker_must_answer_ping():
    with _fake_redis(b"+PONG\r\n") as url:
        scaleout.check_broker(url)
    with _fake_redis(b"-NOAUTH Authentication required.\r\n") as url, pytest.raises(LiveError) as raised:
        scaleout.check_broker(url)
    assert "answered PING with '-NOAUTH Authentication required.'" in str(raised.value)
    assert "secret" not in str(raised.value)


def test_missing_celery_names_the_install_command():
    with pytest.raises(LiveError) as raised:
        scaleout.check_celery("adrq_no_such_module_here")
    assert scaleout.CELERY_INSTALL in str(raised.value)
    assert "ModuleNotFoundError" in str(raised.value)


def test_missing_pgbouncer_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(servers.ENV_PGBOUNCER, raising=False)
    monkeypatch.setattr(servers.shutil, "which", lambda *a, **k: None)
    with pytest.raises(
        LiveError, match="--pgbouncer: no pgbouncer binary: install the Debian package 'pgbouncer'"
    ):
        scaleout.check(LiveShape(pgbouncer=True), [POSTGRESQL])


def test_pgbouncer_is_refused_with_mysql():
    with pytest.raises(LiveError, match=r"PostgreSQL only .* not mysql: add --backend postgresql"):
        scaleout.check(LiveShape(pgbouncer=True), [POSTGRESQL, MARIADB])


def test_throwaway_redis_answers_ping_and_is_gone_after():
    if shutil.which("redis-server") is None:
        skip_or_fail("no redis-server (Debian package redis-server)")
    with servers.redis() as url:
        scaleout.check_broker(f"{url}/1")
    with pytest.raises(LiveError, match="unreachable"):
        scaleout.check_broker(f"{url}/1")
