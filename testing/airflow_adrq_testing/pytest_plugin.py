"""The test suites' pytest plug-in (``pytest11`` entry point): every backend-aware test runs on SQLite,
PostgreSQL and MySQL/MariaDB. Loaded by ``tests/`` and ``bench/tests`` alike.

Fixtures (all function-scoped):

* ``backend`` -- ``"sqlite"``, ``"postgresql"`` or ``"mysql"``; a test that uses
  it (directly or through the fixtures below) runs once per backend. Restrict it
  with ``@pytest.mark.backends("postgresql", "mysql")``.
* ``db_url`` -- this xdist worker's own database for that backend, with the
  tables of ``airflow_adrq.models.metadata``. Every table is emptied after each
  test, so a test starts from empty tables (sequences are not reset: never
  assume an id value).
* ``engine`` -- ``airflow_adrq.engine.create_engine(db_url)``, disposed after the test.
* ``committed`` -- ``committed(build)`` runs ``build(session)`` in a Session on ``engine``,
  commits, and returns what ``build`` returned.
* ``fresh_db_url`` -- a brand-new empty database (no tables), dropped after the
  test: for migration tests.
* ``server_info`` -- the :class:`.servers.ServerInfo` of the backend's
  server (PostgreSQL and MySQL only: mark the test ``backends("postgresql", "mysql")``).
* ``pgbouncer_db_url`` -- ``db_url`` through a throwaway PgBouncer in
  transaction pooling mode (:func:`.servers.pgbouncer`; PostgreSQL only).

Servers are found once, by the controller process, through
:func:`.servers.discover` (``$ADRQ_TEST_POSTGRESQL_URL`` /
``$ADRQ_TEST_MYSQL_URL``, then local servers on 127.0.0.1, then throwaway
servers started from the installed binaries) and handed to the xdist workers,
which share them. Each worker creates its own databases on them, lazily, and
drops them at the end.

``--backend NAME`` (repeatable) selects backends. A backend whose server cannot
be found is an error when ``CI`` is true (:func:`in_ci`), and a skip (with the
reason and how to configure it) otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq.engine import create_engine
from airflow_adrq.models import metadata
from airflow_adrq_testing import servers

__all__ = ["BACKENDS", "in_ci", "skip_or_fail"]

_T = TypeVar("_T")


def in_ci() -> bool:
    """Whether ``CI`` is set (``.ci/run`` sets ``CI=true``): a missing backend then fails, not skips."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(message: str) -> NoReturn:
    """Skip with ``message`` (what is missing, how to get it); under CI fail with it.

    For what CI installs (.ci/run): there a skip would be a silent green. Skips by
    design (a backend not selected, another Airflow release line) use ``pytest.skip``.
    """
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


BACKENDS = ("sqlite", "postgresql", "mysql")

_SELECTED = pytest.StashKey[tuple[str, ...]]()
_SERVERS = pytest.StashKey[dict[str, dict[str, Any]]]()  # backend -> {"info": {...}} or {"error": "..."}

# Run before emptying the tables after a test. A test that leaves a
# transaction open (an engine not disposed, a thread still running) would
# otherwise block the cleanup forever on PostgreSQL; this turns it into an
# error in that test's teardown.
_CLEANUP_LOCK_TIMEOUT = {
    "postgresql": "SET LOCAL lock_timeout = '30s'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = 30",
}


# --- options, server discovery, report header --------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("airflow-adrq")
    group.addoption(
        "--backend",
        action="append",
        dest="adrq_backends",
        choices=BACKENDS,
        metavar="NAME",
        help=f"run backend-aware tests on this backend only (repeatable; one of {', '.join(BACKENDS)}; "
        "default: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SELECTED] = tuple(dict.fromkeys(config.getoption("adrq_backends") or BACKENDS))
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # An xdist worker: use the controller's servers.
        config.stash[_SERVERS] = json.loads(workerinput["adrq_servers"])
        return
    config.stash[_SERVERS] = _discover_servers(config)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "adrq-xdist-hooks")


def _discover_servers(config: pytest.Config) -> dict[str, dict[str, Any]]:
    stack = contextlib.ExitStack()
    # Stops throwaway servers when the session ends (after the workers are gone).
    config.add_cleanup(stack.close)
    found: dict[str, dict[str, Any]] = {}
    for backend in config.stash[_SELECTED]:
        if backend not in servers.BACKENDS:
            continue
        try:
            info = stack.enter_context(servers.discover(backend))
        except servers.ServerNotFoundError as exc:
            if in_ci():
                raise pytest.UsageError(f"CI is set and the {backend} backend is unavailable: {exc}") from exc
            found[backend] = {"error": str(exc)}
        else:
            found[backend] = {"info": dataclasses.asdict(info)}
    return found


class _XdistHooks:
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["adrq_servers"] = json.dumps(node.config.stash[_SERVERS])


def pytest_report_header(config: pytest.Config) -> list[str]:
    # Shows whether the installed wheel (tox) or the source tree is under test.
    lines = [f"adrq package: {os.path.dirname(airflow_adrq.__file__)}"]
    for backend in config.stash[_SELECTED]:
        if backend == "sqlite":
            lines.append(f"adrq sqlite: SQLite {sqlite3.sqlite_version}, a file database per worker")
            continue
        entry = config.stash[_SERVERS][backend]
        if "info" in entry:
            info = entry["info"]
            lines.append(f"adrq {backend}: {info['version']}, {info['how_found']}")
        else:
            lines.append(f"adrq {backend}: UNAVAILABLE, its tests are skipped: {entry['error']}")
    return lines


# --- backend parametrisation -------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None:
        unknown = [name for name in marker.args if name not in BACKENDS]
        if unknown or not marker.args:
            pytest.fail(
                f"{metafunc.definition.nodeid}: @pytest.mark.backends{marker.args!r}: "
                f"expected one or more of {', '.join(BACKENDS)}",
                pytrace=False,
            )
        if "backend" not in metafunc.fixturenames:
            pytest.fail(
                f"{metafunc.definition.nodeid}: @pytest.mark.backends without the backend fixture",
                pytrace=False,
            )
    if "backend" not in metafunc.fixturenames:
        return
    allowed = marker.args if marker is not None else BACKENDS
    selected = metafunc.config.stash[_SELECTED]
    params = [pytest.param(name, id=name) for name in allowed if name in selected]
    if not params:
        reason = f"runs on {', '.join(allowed)}; selected: {', '.join(selected)}"
        params = [pytest.param(None, id="unselected", marks=pytest.mark.skip(reason=reason))]
    metafunc.parametrize("backend", params, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str | None = getattr(request, "param", None)
    if name is None:
        raise RuntimeError("the backend fixture is parametrised by conftest.pytest_generate_tests")
    if name in servers.BACKENDS:
        entry = request.config.stash[_SERVERS][name]
        if "error" in entry:
            pytest.skip(f"{name} unavailable (CI=true makes this an error): {entry['error']}")
    return name


# --- databases ---------------------------------------------------------------


class _WorkerDatabases:
    """This worker's database per backend: created on first use, dropped at exit."""

    def __init__(self, config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._config = config
        self._tmp_path_factory = tmp_path_factory
        self._worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self._urls: dict[str, str] = {}
        self._engines: dict[str, sa.Engine] = {}

    def server_url(self, backend: str) -> str:
        return str(self._config.stash[_SERVERS][backend]["info"]["url"])

    def new_name(self, kind: str) -> str:
        # Unique across runs and across people sharing one server.
        return f"adrq_{kind}_{self._worker}_{uuid.uuid4().hex[:10]}"

    def url(self, backend: str) -> str:
        if backend not in self._urls:
            if backend == "sqlite":
                path = self._tmp_path_factory.mktemp("sqlite") / "adrq.db"
                url = f"sqlite:///{path}"
            else:
                url = servers.create_database(self.server_url(backend), self.new_name("test"))
            self._urls[backend] = url
            engine = create_engine(url)
            metadata.create_all(engine)
            self._engines[backend] = engine
        return self._urls[backend]

    def empty(self, backend: str) -> None:
        """Delete every row, children before parents (a few ms on empty tables)."""
        with self._engines[backend].begin() as conn:
            if backend in _CLEANUP_LOCK_TIMEOUT:
                conn.exec_driver_sql(_CLEANUP_LOCK_TIMEOUT[backend])
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())

    def close(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        for backend, url in self._urls.items():
            if backend != "sqlite":
                servers.drop_database(self.server_url(backend), str(sa.make_url(url).database))


@pytest.fixture(scope="session")
def _worker_databases(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_WorkerDatabases]:
    databases = _WorkerDatabases(request.config, tmp_path_factory)
    yield databases
    databases.close()


@pytest.fixture
def db_url(backend: str, _worker_databases: _WorkerDatabases) -> Iterator[str]:
    url = _worker_databases.url(backend)
    yield url
    _worker_databases.empty(backend)


@pytest.fixture(scope="session")
def _pgbouncer(_worker_databases: _WorkerDatabases) -> Iterator[str | Exception]:
    """One throwaway PgBouncer (transaction pooling) per worker, in front of the PostgreSQL server."""
    with contextlib.ExitStack() as stack:
        try:
            url: str | Exception = stack.enter_context(
                servers.pgbouncer(_worker_databases.server_url("postgresql"))
            )
        except servers.ServerNotFoundError as exc:
            url = exc  # reported by the tests that need it
        yield url


@pytest.fixture
def pgbouncer_db_url(backend: str, db_url: str, _pgbouncer: str | Exception) -> str:
    """``db_url`` reached through PgBouncer in transaction pooling mode (PostgreSQL only).

    Missing ``pgbouncer`` binary: a skip naming the package, an error with CI=true.
    """
    if backend != "postgresql":
        raise RuntimeError("pgbouncer_db_url is for PostgreSQL: mark the test backends('postgresql')")
    if isinstance(_pgbouncer, Exception):
        skip_or_fail(f"PgBouncer unavailable (Debian package pgbouncer): {_pgbouncer}")
    return (
        sa.make_url(_pgbouncer)
        .set(database=sa.make_url(db_url).database)
        .render_as_string(hide_password=False)
    )


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(db_url)
    yield engine
    # Close pooled connections before db_url empties the tables.
    engine.dispose()


@pytest.fixture
def fresh_db_url(backend: str, _worker_databases: _WorkerDatabases, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    server_url = _worker_databases.server_url(backend)
    name = _worker_databases.new_name("fresh")
    url = servers.create_database(server_url, name)
    yield url
    servers.drop_database(server_url, name)


@pytest.fixture
def server_info(backend: str, request: pytest.FixtureRequest) -> servers.ServerInfo:
    if backend not in servers.BACKENDS:
        raise RuntimeError(
            f"{backend} has no server: mark the test @pytest.mark.backends('postgresql', 'mysql')"
        )
    return servers.ServerInfo(**request.config.stash[_SERVERS][backend]["info"])


# --- rows ----------------------------------------------------------------------


@pytest.fixture
def committed(engine: sa.Engine) -> Callable[[Callable[[Session], _T]], _T]:
    """``committed(build)``: ``build(session)`` in a Session on ``engine``, then COMMIT; its result."""

    def committed(build: Callable[[Session], _T]) -> _T:
        with Session(engine) as session:
            result = build(session)
            session.commit()
        return result

    return committed
