"""The tests of ``airflow-adrq bench --airflow --live`` (``tox -e airflow-live``).

They need the full ``apache-airflow`` 3.3.2 distribution (the ``airflow`` command with its
api-server, the task SDK, the standard provider's ``EmptyOperator``) and the Celery provider, not
only ``apache-airflow-core``: elsewhere this folder is not collected (the header says why), and
with ``ADRQ_REQUIRE_LIVE`` set (``tox -e airflow-live`` sets it) that is an error instead, so a
live run that cannot start fails rather than passing as nothing.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LIVE_LINE = "3.3.2"
_NEEDED = {
    "apache-airflow": "the full apache-airflow distribution",
    "apache-airflow-task-sdk": "the task SDK (airflow.sdk)",
    "apache-airflow-providers-standard": "the standard provider (EmptyOperator)",
    "apache-airflow-providers-celery": "the Celery provider (CeleryExecutor)",
}


def _unavailable() -> str | None:
    """Why the live run cannot run in this environment (None: it can)."""
    try:
        core = importlib.metadata.version("apache-airflow-core")
    except importlib.metadata.PackageNotFoundError:
        return "apache-airflow-core is not installed"
    if core != LIVE_LINE:
        return f"the live run is written for Airflow {LIVE_LINE}; this is {core}"
    for dist, what in _NEEDED.items():
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"needs {what} ({dist}): tox -e airflow-live installs it"
    if not (Path(sys.executable).parent / "airflow").exists():
        return "no airflow command next to this interpreter"
    return None


UNAVAILABLE = _unavailable()
if UNAVAILABLE is not None and os.environ.get("ADRQ_REQUIRE_LIVE"):
    raise RuntimeError(f"ADRQ_REQUIRE_LIVE is set but the live run cannot run here: {UNAVAILABLE}")
collect_ignore_glob = ["test_*.py"] if UNAVAILABLE else []


def pytest_report_header() -> list[str]:
    return [f"adrq live: not collected: {UNAVAILABLE}"] if UNAVAILABLE else []


@pytest.fixture
def broker(backend: str) -> Iterator[tuple[str, ...]]:
    """``--broker-url`` for the PostgreSQL shape (CeleryExecutor): none while the local Redis answers
    (the run's default), else a throwaway ``redis-server``'s; nothing for the other backends."""
    if backend != "postgresql":
        yield ()
        return
    # Here: where this folder is not collected, none of them need be installed.
    import redis

    from airflow_adrq_testing import servers
    from airflow_adrq_testing.pytest_plugin import skip_or_fail

    try:
        redis.Redis(socket_connect_timeout=3).ping()
    except redis.RedisError:
        pass
    else:
        yield ()
        return
    try:
        with servers.redis() as url:
            yield ("--broker-url", f"{url}/1")
    except servers.ServerNotFoundError as exc:
        message = f"no Redis for the CeleryExecutor deployment: none on 127.0.0.1:6379, and {exc}"
        if os.environ.get("ADRQ_REQUIRE_LIVE"):
            pytest.fail(message)
        skip_or_fail(message)
