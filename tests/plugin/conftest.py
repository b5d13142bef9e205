"""Fixtures for the Airflow plug-in tests (tox -e airflow31 ... airflow34; needs apache-airflow-core).

Each backend gets its own database, migrated once per test session by
Airflow's own ``airflow db migrate`` (a subprocess, as an operator runs it).
Tests talk to it through engines set up the way Airflow sets up its own
(``airflow.utils.orm_event_handlers.setup_event_handlers``; READ COMMITTED on
MySQL/MariaDB, as ``airflow.settings.prepare_engine_args`` does).

Servers are found by ``airflow_adrq_testing.servers.discover`` as in the rest of the
suite (``ADRQ_TEST_POSTGRESQL_URL`` / ``ADRQ_TEST_MYSQL_URL``, local servers,
throwaway servers). A backend without a server is skipped with its reason
shown; with ``CI=true`` it is an error instead.
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

from tests.plugin.adrq_af_scenario import empty  # noqa: E402
from tests.support.ci import skip_or_fail  # noqa: E402

# refused/ checks that Airflow 3.0 is refused: it runs in its own env (tox -e
# airflow30, with --noconftest, so this line does not apply there), never
# beside a supported Airflow.
collect_ignore = ["refused"]

BACKENDS = ("sqlite", "postgresql", "mysql")
_AIRFLOW_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb"}


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


@pytest.fixture(scope="session")
def af_server(af_backend):
    """A server for ``af_backend`` found as the rest of the suite finds one (airflow_adrq_testing.servers)."""
    from airflow_adrq_testing import servers

    try:
        with servers.discover(af_backend) as info:
            url = sa.engine.make_url(info.url)
            # Airflow needs its sync drivers here (plus asyncpg/aiomysql, installed by tox).
            yield url.set(drivername=_AIRFLOW_DRIVERS[af_backend])
    except servers.ServerNotFoundError as exc:
        skip_or_fail(f"{af_backend} server not available for the Airflow plug-in tests: {exc}")


@pytest.fixture(scope="session")
def af_pgbouncer(af_backend, af_server):
    """A throwaway PgBouncer (transaction pooling) in front of the PostgreSQL server."""
    from airflow_adrq_testing import servers

    if af_backend != "postgresql":
        raise RuntimeError("af_pgbouncer is for PostgreSQL")
    try:
        with servers.pgbouncer(af_server) as url:
            yield url
    except servers.ServerNotFoundError as exc:
        skip_or_fail(f"PgBouncer not available for the Airflow plug-in tests: {exc}")


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


@pytest.fixture(scope="session")
def airflow_db(af_backend, tmp_path_factory, request):
    """The backend's database, migrated by the installed Airflow's ``airflow db migrate``."""
    tag = f"adrq_af_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    if af_backend == "sqlite":
        directory = tmp_path_factory.mktemp("sqlite")
        urls = [sa.engine.make_url(f"sqlite:///{directory}/{tag}{s}.db") for s in ("", "_scratch")]

        def drop():
            return None

    else:
        from airflow_adrq_testing import servers

        server = request.getfixturevalue("af_server")
        names = [tag, f"{tag}_scratch"]
        urls = [sa.engine.make_url(servers.create_database(server, name)) for name in names]

        def drop():
            for name in names:
                servers.drop_database(server, name)

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
