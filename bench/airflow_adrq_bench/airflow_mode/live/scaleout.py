"""The scale-out shapes of a deployment: CeleryExecutor and its broker, PgBouncer in front of PostgreSQL.

:func:`check` runs before the first deployment, so that a missing piece is
one :class:`~.config.LiveError` naming the fix instead of a component dying
in the middle of a run: ``--pgbouncer`` needs PostgreSQL targets and the
``pgbouncer`` binary; ``--executor celery`` needs a broker that answers (a
TCP connect, and ``PING`` for Redis) and the Celery provider importable by
this environment's Airflow (checked in a child interpreter: the controller
never imports Airflow). :func:`pooled` starts a deployment's PgBouncer,
:func:`broker_url` picks its Redis database.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Final
from urllib.parse import unquote, urlsplit

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.databases import Target
from airflow_adrq_bench.airflow_mode.live.config import LiveError, LiveShape
from airflow_adrq_testing import servers

__all__ = [
    "CELERY_INSTALL",
    "CELERY_MODULE",
    "DEFAULT_REDIS",
    "broker_url",
    "check",
    "check_broker",
    "check_celery",
    "pooled",
    "redacted",
]

#: What installs CeleryExecutor here (provider 3.26.0 fails to import with celery 5.7:
#: ``cannot import name 'retry' from 'celery.backends.database'``).
CELERY_INSTALL: Final = "pip install apache-airflow-providers-celery 'celery[redis]<5.7'"
#: The module the scheduler's CeleryExecutor and ``airflow celery worker`` import first.
CELERY_MODULE: Final = "airflow.providers.celery.executors.celery_executor"
#: The default broker: the local Redis (``--broker-url`` names another).
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379"

# Seconds a broker gets to accept the connection and answer PING; the import check's limit.
_CONNECT_TIMEOUT_S: Final = 3.0
_IMPORT_TIMEOUT_S: Final = 180.0
_DEFAULT_PORTS: Final = {"redis": 6379, "rediss": 6379, "amqp": 5672, "pyamqp": 5672}
# Redis databases 1..15 in turn, one per deployment of this process (0 is left to other users).
_REDIS_DBS = itertools.count()


def broker_url(shape: LiveShape) -> str:
    """The broker of one deployment: ``--broker-url``, or the next Redis database of the local server."""
    return shape.broker_url or f"{DEFAULT_REDIS}/{1 + next(_REDIS_DBS) % 15}"


def redacted(url: str) -> str:
    """``url`` without its password (for reports and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def check(shape: LiveShape, targets: Sequence[Target]) -> None:
    """Raise :class:`LiveError` naming the fix when this environment cannot run ``shape`` on ``targets``."""
    if shape.pgbouncer:
        others = [t.name for t in targets if t.backend != "postgresql"]
        if others:
            raise LiveError(
                f"--pgbouncer is PostgreSQL only (PgBouncer speaks PostgreSQL's protocol), not "
                f"{', '.join(others)}: add --backend postgresql, or give PostgreSQL --db URLs only"
            )
        try:
            if not os.environ.get(servers.ENV_PGBOUNCER, "").strip():  # else that one is used
                servers.require_pgbouncer()
        except servers.ServerNotFoundError as exc:
            raise LiveError(f"--pgbouncer: {exc}") from None
    if shape.celery:
        check_broker(shape.broker_url or f"{DEFAULT_REDIS}/0")
        check_celery()


def check_broker(url: str) -> None:
    """Raise :class:`LiveError` unless the broker at ``url`` accepts a connection (Redis: answers PING)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    if port is None:
        raise LiveError(f"--broker-url {redacted(url)}: no port, and none known for {scheme!r}")
    host = parts.hostname or "127.0.0.1"
    fix = (
        "start Redis (Debian package redis-server; `redis-server --daemonize yes` listens on "
        "127.0.0.1:6379), or name a running broker with --broker-url"
        if scheme.startswith("redis")
        else "start it, or name a running broker with --broker-url"
    )
    try:
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S) as sock:
            if scheme != "redis":
                return
            reply = _redis_ping(sock, parts.username, parts.password)
    except OSError as exc:
        raise LiveError(f"the Celery broker {redacted(url)} is unreachable ({exc}): {fix}") from None
    if not reply.startswith(b"+PONG"):
        answer = reply.decode(errors="replace").strip()
        raise LiveError(f"the Celery broker {redacted(url)} answered PING with {answer!r}: {fix}")


def _redis_ping(sock: socket.socket, user: str | None, password: str | None) -> bytes:
    """``AUTH`` (with a password in the URL) and ``PING`` in Redis's protocol; the last reply line."""
    commands = [["PING"]]
    if password is not None:
        auth = [unquote(user), unquote(password)] if user else [unquote(password)]
        commands.insert(0, ["AUTH", *auth])
    for words in commands:
        encoded = [w.encode() for w in words]
        sock.sendall(b"*%d\r\n" % len(encoded) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in encoded))
        reply = sock.recv(512)
        if not reply.startswith(b"+"):
            return reply
    return reply


def check_celery(module: str = CELERY_MODULE) -> None:
    """Raise :class:`LiveError` with the install command unless this environment's Python imports ``module``.

    A child interpreter with a scratch ``AIRFLOW_HOME`` (importing Airflow
    writes its default configuration there) and none of the caller's
    ``AIRFLOW_*`` settings, as the components get.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    with tempfile.TemporaryDirectory(prefix="adrq-live-celery-check-") as home:
        env["AIRFLOW_HOME"] = home
        try:
            result = subprocess.run(
                [sys.executable, "-c", f"import {module}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=_IMPORT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LiveError(f"importing {module} took over {_IMPORT_TIMEOUT_S:.0f} s") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        raise LiveError(
            f"--executor celery: this environment cannot import {module} ({lines[-1]}): {CELERY_INSTALL}"
        )


@contextlib.contextmanager
def pooled(shape: LiveShape, url: str, server_url: str) -> Iterator[str]:
    """``url`` (a database on the PostgreSQL server at ``server_url``) as the components reach it:
    through a throwaway PgBouncer in transaction pooling mode with ``shape.pgbouncer`` (stopped on
    leaving), else unchanged."""
    if not shape.pgbouncer:
        yield url
        return
    with contextlib.ExitStack() as stack:
        try:
            bouncer = sa.make_url(stack.enter_context(servers.pgbouncer(server_url)))
        except servers.ServerNotFoundError as exc:
            raise LiveError(f"PgBouncer: {exc}") from None
        yield sa.make_url(url).set(host=bouncer.host, port=bouncer.port).render_as_string(hide_password=False)
