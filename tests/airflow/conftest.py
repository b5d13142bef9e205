# mypy: ignore-errors
"""Fixtures for the Airflow plug-in tests (tox -e airflow; needs apache-airflow-core==3.3.2).

Each backend gets its own database, migrated once per test session by
Airflow's own ``airflow db migrate`` (a subprocess, as an operator runs it).
Tests talk to it through engines set up the way Airflow sets up its own
(``airflow.utils.orm_event_handlers.setup_event_handlers``; READ COMMITTED on
MySQL/MariaDB, as ``airflow.settings.prepare_engine_args`` does).

Servers: ``ADRQ_TEST_POSTGRESQL_URL`` / ``ADRQ_TEST_MYSQL_URL`` (a URL of a
server database we may CREATE DATABASE from), else the local 127.0.0.1
servers. A backend that is not reachable is skipped with its reason shown;
with ``CI=true`` it is an error instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

# Airflow reads its configuration at import time: point it at a private home
# before anything imports it. Its own engine (SQLite below) is not used by the
# tests; every backend gets an engine of its own.
_HOME = Path(tempfile.mkdtemp(prefix="adrq-airflow-home-"))
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME}/airflow.db"
os.environ.pop("AIRFLOW__CORE__ASSET_MANAGER_CLASS", None)

import sqlalchemy as sa  # noqa: E402
from adrq_af_scenario import empty  # noqa: E402

BACKENDS = ("sqlite", "postgresql", "mysql")
_DEFAULT_SERVER_URLS = {
    "postgresql": "postgresql+psycopg2://root@127.0.0.1:5432/test",
    "mysql": "mysql+mysqldb://root@127.0.0.1:3306/test",
}
_ENV_URLS = {"postgresql": "ADRQ_TEST_POSTGRESQL_URL", "mysql": "ADRQ_TEST_MYSQL_URL"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "airflow_backends(*names): run an Airflow plug-in test only on these backends"
    )


def pytest_generate_tests(metafunc):
    if "af_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("airflow_backends")
        names = marker.args if marker else BACKENDS
        metafunc.parametrize("af_backend", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def af_backend(request):
    return request.param


def _server_url(backend: str) -> sa.engine.URL:
    return sa.engine.make_url(os.environ.get(_ENV_URLS[backend]) or _DEFAULT_SERVER_URLS[backend])


def _unavailable(backend: str, why: str):
    message = f"{backend} server not available for the Airflow plug-in tests: {why}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class AirflowDatabase:
    """A database migrated by ``airflow db migrate`` (plus an empty sibling for our own DDL)."""

    def __init__(self, backend: str, url: sa.engine.URL, scratch_url: sa.engine.URL, drop):
        self.backend = backend
        self.url = url
        self.scratch_url = scratch_url
        self._drop = drop

    def engine(self, **kwargs) -> sa.Engine:
        """An engine configured as Airflow configures its own."""
        from airflow.utils.orm_event_handlers import setup_event_handlers

        if self.backend == "mysql":
            kwargs.setdefault("isolation_level", "READ COMMITTED")
        engine = sa.create_engine(self.url, **kwargs)
        setup_event_handlers(engine)
        return engine

    def airflow_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.url.render_as_string(hide_password=False)
        return env


def _migrate(url: sa.engine.URL) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url.render_as_string(hide_password=False)
    airflow = Path(sys.executable).with_name("airflow")
    return subprocess.run(
        [str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _create_server_databases(backend: str, names: list[str]):
    server = _server_url(backend)
    try:
        admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as exc:
        _unavailable(backend, str(exc).splitlines()[0])

    def drop():
        with admin.connect() as conn:
            if backend == "postgresql":
                for name in names:
                    conn.exec_driver_sql(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                        (name,),
                    )
            for name in names:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()

    return [server.set(database=name) for name in names], drop


@pytest.fixture(scope="session")
def airflow_db(af_backend, tmp_path_factory):
    """The backend's database, migrated by Airflow 3.3.2's ``airflow db migrate``."""
    tag = f"adrq_af_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    if af_backend == "sqlite":
        directory = tmp_path_factory.mktemp("sqlite")
        urls = [sa.engine.make_url(f"sqlite:///{directory}/{tag}{s}.db") for s in ("", "_scratch")]

        def drop():
            return None

    else:
        urls, drop = _create_server_databases(af_backend, [tag, f"{tag}_scratch"])
    result = _migrate(urls[0])
    if result.returncode != 0:
        drop()
        pytest.fail(
            f"airflow db migrate failed on {af_backend}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    db = AirflowDatabase(af_backend, urls[0], urls[1], drop)
    yield db
    drop()


@pytest.fixture
def af_engine(airflow_db):
    """An Airflow-configured engine on the migrated database; scenario tables emptied afterwards."""
    engine = airflow_db.engine()
    yield engine
    with engine.begin() as conn:
        empty(conn)
    engine.dispose()
