"""Find (or start) the database servers of the tests and the benchmark: PostgreSQL, MySQL/MariaDB.

:func:`discover` takes the first that answers of:

1. the URL in ``ADRQ_TEST_POSTGRESQL_URL`` / ``ADRQ_TEST_MYSQL_URL``; when set it is the only
   candidate: a server named explicitly that does not answer is an error, never a silent fallback;
2. a server on ``127.0.0.1`` with the usual trust/empty-password accounts (``root`` or ``postgres``
   on 5432; ``root`` on 3306), unless ``ADRQ_TEST_NO_LOCAL=1``;
3. a throwaway server from the installed binaries, in a temporary directory, on a free port,
   durability off; stopped and its directory removed when the context exits.

On a server it did not start it only creates and drops the databases its callers name. It also
starts throwaway PgBouncer (:func:`pgbouncer`) and Redis (:func:`redis`) servers.

PostgreSQL is started by pytest-postgresql's ``PostgreSQLExecutor`` (``pg_ctl start -w`` returns
once the server accepts connections), the others by mirakuru's ``TCPExecutor`` it is built on.
pytest-mysql's ``MySQLExecutor`` is not used: it starts ``mysqld_safe`` without ``--no-defaults``
(``/etc/mysql`` would configure the server), its install step leaves ``root`` reachable only on
the Unix socket, and it shuts the server down logging in as the OS account's name.

Started by root, a server runs as the ``postgres`` / ``mysql`` / ``redis`` account (``nobody``
when missing), which owns its directory: PostgreSQL and PgBouncer refuse root, ``mariadbd``
needs ``--user``. ``PostgreSQLExecutor`` runs ``pg_ctl`` with no way to name a user, so it gets
a script running ``pg_ctl`` through ``setpriv``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from airflow_adrq.errors import AdrqError

if TYPE_CHECKING:
    from mirakuru import TCPExecutor

ServerBackend = Literal["postgresql", "mysql"]
BACKENDS: tuple[ServerBackend, ...] = ("postgresql", "mysql")

#: Set to ``1`` to ignore servers already running on 127.0.0.1 (step 2).
ENV_NO_LOCAL = "ADRQ_TEST_NO_LOCAL"
#: Names the PgBouncer to use instead of starting one (in ``transaction`` pool_mode).
ENV_PGBOUNCER = "ADRQ_TEST_PGBOUNCER_URL"

# Seconds to wait for a candidate server (a firewalled port must not stall a
# test session), and for a throwaway one to start accepting connections.
CONNECT_TIMEOUT = 3
START_TIMEOUT = 60
# Database names we create or drop: lower-case, no quoting surprises on any
# backend, and short enough for PostgreSQL (63) and MySQL (64).
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class ServerNotFoundError(AdrqError):
    """No database server could be found or started for this backend."""


@dataclass(frozen=True)
class ServerInfo:
    """A server that answered, and how it was found; ``url`` (a superuser, a maintenance database)
    is a plain string, password included, to hand to other processes."""

    backend: ServerBackend
    url: str
    version: str
    how_found: str


@dataclass(frozen=True)
class _Backend:
    """Everything that differs between server kinds, in one place."""

    name: ServerBackend
    label: str
    env_var: str
    debian_package: str
    example_url: str
    local_urls: tuple[str, ...]
    version_sql: str
    create_sql: str
    drop_sql: str
    start: Callable[[], contextlib.AbstractContextManager[ServerInfo]]
    driver_hint: str


def env_var(backend: ServerBackend) -> str:
    """The environment variable that names this backend's server URL."""
    return _backend(backend).env_var


@contextlib.contextmanager
def discover(backend: ServerBackend, *, environ: Mapping[str, str] | None = None) -> Iterator[ServerInfo]:
    """Yield a reachable server for ``backend`` (the module docstring says in which order);
    :class:`ServerNotFoundError`, naming the Debian package and the variable, when none is."""
    spec = _backend(backend)
    env = os.environ if environ is None else environ
    explicit = env.get(spec.env_var, "").strip()
    if explicit:
        try:
            version = server_version(explicit)
        except Exception as exc:
            detail = _first_line(getattr(exc, "orig", None) or exc)
            raise ServerNotFoundError(
                f"{spec.env_var} is set but the {spec.label} server there does not answer: {detail}"
            ) from exc
        yield ServerInfo(backend, explicit, version, f"from ${spec.env_var}")
        return
    tried: list[str] = []
    if env.get(ENV_NO_LOCAL, "").strip() in ("", "0"):
        for candidate in spec.local_urls:
            try:
                version = server_version(candidate)
            except ImportError as exc:
                raise ServerNotFoundError(f"{exc}; install {spec.driver_hint}") from exc
            except sa.exc.DBAPIError as exc:
                tried.append(f"{sa.make_url(candidate).render_as_string()}: {_first_line(exc.orig)}")
                continue
            url = sa.make_url(candidate)
            yield ServerInfo(
                backend, candidate, version, f"local server {url.host}:{url.port} (user {url.username})"
            )
            return
    else:
        tried.append(f"local servers skipped ({ENV_NO_LOCAL} is set)")
    with contextlib.ExitStack() as stack:
        try:
            info = stack.enter_context(spec.start())
        except ServerNotFoundError as exc:
            raise ServerNotFoundError(
                f"no {spec.label} server: {spec.env_var} is not set; {'; '.join(tried)}; and {exc}. "
                f"Install the Debian package {spec.debian_package!r} (it need not be running), "
                f"or set {spec.env_var}={spec.example_url}"
            ) from exc
        yield info


def server_version(url: str | URL) -> str:
    """The version of the server at ``url``, e.g. ``"PostgreSQL 15.14"``; the driver's error if none."""
    spec = _backend_for_url(url)
    engine = sa.create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": CONNECT_TIMEOUT})
    try:
        with engine.connect() as conn:
            raw = str(conn.exec_driver_sql(spec.version_sql).scalar_one())
    finally:
        engine.dispose()
    if spec.name == "mysql":
        return f"{'MariaDB' if 'mariadb' in raw.lower() else 'MySQL'} {raw}"
    return f"{spec.label} {raw}"


def create_database(server_url: str | URL, name: str) -> str:
    """Create the empty database ``name`` (``[a-z_][a-z0-9_]*``; fails if it exists) and return its URL.

    PostgreSQL copies ``template0`` with UTF8 encoding, so nothing added to ``template1`` leaks in;
    MySQL/MariaDB use ``utf8mb4`` as Airflow's docs ask.
    """
    _run_ddl(server_url, _backend_for_url(server_url).create_sql, name)
    return sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str | URL, name: str) -> None:
    """Drop database ``name`` if it exists: PostgreSQL disconnects the sessions still using it
    (``WITH (FORCE)``), MySQL/MariaDB wait for them to release their metadata locks."""
    _run_ddl(server_url, _backend_for_url(server_url).drop_sql, name)


def _run_ddl(server_url: str | URL, template: str, name: str) -> None:
    if not _DATABASE_NAME.fullmatch(name):
        raise ValueError(f"database name {name!r} must match {_DATABASE_NAME.pattern}")
    # CREATE/DROP DATABASE cannot run inside a transaction on PostgreSQL.
    engine = sa.create_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            # Identifiers cannot be bound parameters: validated above, quoted here.
            quoted = conn.dialect.identifier_preparer.quote_identifier(name)
            conn.exec_driver_sql(template.format(name=quoted))
    finally:
        engine.dispose()


# --- throwaway servers -------------------------------------------------------


@contextlib.contextmanager
def start_postgresql(settings: Mapping[str, str] | None = None) -> Iterator[ServerInfo]:
    """A throwaway PostgreSQL from the installed binaries; ``settings``: more ``-c name=value``."""
    from pytest_postgresql.executors import PostgreSQLExecutor

    bindir = _postgresql_bindir()
    # Durability off (the executor passes -F: fsync off); connections enough
    # for the concurrency tests of two xdist workers at once.
    options = "-c listen_addresses=127.0.0.1 -c synchronous_commit=off -c full_page_writes=off"
    options += " -c max_connections=300" + "".join(
        f" -c {name}={value}" for name, value in (settings or {}).items()
    )
    with _scratch("postgresql", "postgres") as (tmp, as_user):
        port = free_port()
        executor = PostgreSQLExecutor(
            executable=_run_as(bindir / "pg_ctl", as_user, tmp),
            host="127.0.0.1",
            port=port,
            datadir=str(tmp / "data"),
            unixsocketdir=str(tmp),
            logfile=str(tmp / "server.log"),
            startparams="-w",
            dbname="postgres",
            timeout=START_TIMEOUT,
            postgres_options=options,
        )
        with _running(executor, "the throwaway postgresql server", tmp / "server.log", launcher=True):
            url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
            yield _throwaway("postgresql", url, bindir / "postgres", as_user)


def _postgresql_bindir() -> Path:
    # Debian/Ubuntu keep the server binaries out of PATH, one directory per
    # major version; prefer the newest. Elsewhere (Homebrew, RPMs) they are on PATH.
    candidates = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")),
        key=lambda p: tuple(int(part) for part in re.findall(r"\d+", p.parent.name)),
        reverse=True,
    )
    on_path = shutil.which("pg_ctl")
    for bindir in [*candidates, *([Path(on_path).parent] if on_path else [])]:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise ServerNotFoundError(
        "no PostgreSQL server binaries (pg_ctl, initdb, postgres) in /usr/lib/postgresql/*/bin or on PATH"
    )


def _run_as(program: Path, account: pwd.struct_passwd | None, tmp: Path) -> str:
    """``program``, or (``account`` given) a script in ``tmp`` that runs it as ``account``."""
    if account is None:
        return str(program)
    setpriv = _which("setpriv", extra_dirs=("/usr/bin",))
    if setpriv is None:
        raise ServerNotFoundError("running as root, and no setpriv (util-linux) to start it as another user")
    script = tmp / program.name
    ids = f"--reuid={account.pw_uid} --regid={account.pw_gid} --clear-groups"
    script.write_text(f'#!/bin/sh\nexec {setpriv} {ids} {shlex.quote(str(program))} "$@"\n')
    script.chmod(0o755)
    return str(script)


@contextlib.contextmanager
def start_mysql(settings: Mapping[str, str] | None = None) -> Iterator[ServerInfo]:
    """A throwaway MariaDB/MySQL from the installed binaries; ``settings``: more ``--name=value``."""
    mysqld = _which("mariadbd", "mysqld", extra_dirs=("/usr/sbin", "/usr/libexec", "/usr/local/mysql/bin"))
    if mysqld is None:
        raise ServerNotFoundError("no MariaDB/MySQL server binary (mariadbd or mysqld) found")
    about = subprocess.run([mysqld, "--version"], capture_output=True, text=True, check=False).stdout
    install_db = _which("mariadb-install-db", "mysql_install_db", extra_dirs=("/usr/bin",))
    with _scratch("mysql", "mysql") as (tmp, as_user):
        data, log = tmp / "data", tmp / "server.log"
        if "mariadb" not in about.lower():
            # MySQL 8 initialises its own data directory. Written from MySQL's
            # manual; only MariaDB is installable on the machines we test on.
            initialise, extra = [mysqld, "--no-defaults", "--initialize-insecure"], ["--mysqlx=OFF"]
        elif install_db is not None:
            # root with no password; grants for 127.0.0.1 without a DNS lookup.
            initialise = [install_db, "--no-defaults", "--auth-root-authentication-method=normal"]
            initialise, extra = [*initialise, "--skip-test-db", "--skip-name-resolve"], []
        else:
            raise ServerNotFoundError("mariadbd found but not mariadb-install-db")
        init = subprocess.run(
            [*initialise, f"--datadir={data}"], capture_output=True, text=True, check=False, **_as(as_user)
        )
        if init.returncode != 0:
            raise ServerNotFoundError(f"initialising a throwaway mysql data directory failed:\n{init.stderr}")
        port = free_port()
        # --no-defaults must come first: ignore /etc/mysql.
        command = [mysqld, "--no-defaults", f"--datadir={data}", f"--port={port}", "--bind-address=127.0.0.1"]
        command += [f"--socket={tmp / 'mysqld.sock'}", f"--pid-file={tmp / 'mysqld.pid'}", f"--tmpdir={tmp}"]
        # A throwaway server: no binary log, no flush at each commit.
        command += [f"--log-error={log}", "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0"]
        extra += [f"--{name}={value}" for name, value in (settings or {}).items()]
        executor = _executor([*command, "--max-connections=300", *extra], port, signal.SIGTERM, as_user)
        with _running(executor, "the throwaway mysql server", log):
            yield _throwaway("mysql", f"mysql+mysqldb://root@127.0.0.1:{port}/", Path(mysqld), as_user)


def _throwaway(
    backend: ServerBackend, url: str, binary: Path, as_user: pwd.struct_passwd | None
) -> ServerInfo:
    where = sa.make_url(url)
    who = f" as user {as_user.pw_name}" if as_user is not None else ""
    how = f"throwaway server from {binary}{who}, {where.host}:{where.port}"
    return ServerInfo(backend, url, server_version(url), how)


# --- starting and stopping processes -----------------------------------------


@contextlib.contextmanager
def _scratch(kind: str, account: str) -> Iterator[tuple[Path, pwd.struct_passwd | None]]:
    """A temporary directory owned by the account a server runs as (None: ourselves), removed after."""
    as_user = _unprivileged_account(account)
    tmp = Path(tempfile.mkdtemp(prefix=f"adrq-{kind}-"))
    try:
        if as_user is not None:
            os.chown(tmp, as_user.pw_uid, as_user.pw_gid)
        yield tmp, as_user
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _executor(
    command: list[str], port: int, stop_signal: int, as_user: pwd.struct_passwd | None
) -> TCPExecutor:
    """``command`` run as ``as_user``, started once it accepts connections on 127.0.0.1:``port``.
    Every server here writes its own log file; its output is dropped, never a pipe nobody reads."""
    from mirakuru import TCPExecutor

    return TCPExecutor(
        command,
        host="127.0.0.1",
        port=port,
        timeout=START_TIMEOUT,
        stop_signal=stop_signal,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        popen_kwargs=_as(as_user),
    )


@contextlib.contextmanager
def _running(executor: TCPExecutor, what: str, log: Path, *, launcher: bool = False) -> Iterator[None]:
    """Start ``executor``, stop it on leaving; if it fails, :class:`ServerNotFoundError` with ``log``'s end.

    mirakuru returns once the port is open. A ``launcher`` (``pg_ctl start -w``)
    exits once its server accepts connections, which may be later: it is waited for.
    """
    from mirakuru.exceptions import ExecutorError, ProcessFinishedWithError

    try:
        executor.start()
        exit_code = executor.process.wait(START_TIMEOUT) if launcher and executor.process else 0
        if exit_code:
            raise ProcessFinishedWithError(executor, exit_code)
    except (ExecutorError, subprocess.SubprocessError, OSError) as exc:
        with contextlib.suppress(ExecutorError, subprocess.SubprocessError, OSError):
            executor.stop()
        try:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        except OSError as missing:
            tail = f"(no log: {missing})"
        raise ServerNotFoundError(f"{what} did not start: {exc}\n{tail}") from exc
    try:
        yield
    finally:
        executor.stop()


def _unprivileged_account(preferred: str) -> pwd.struct_passwd | None:
    """The account to run a server as when we are root, else None (as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in (preferred, "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServerNotFoundError(f"running as root and neither a {preferred!r} nor a 'nobody' account exists")


def _as(account: pwd.struct_passwd | None) -> dict[str, Any]:
    """``subprocess.Popen`` arguments running as ``account`` (without root's supplementary groups)."""
    return {} if account is None else {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a clash in the moment before a server binds it fails loudly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _which(*names: str, extra_dirs: Sequence[str]) -> str | None:
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(extra_dirs))
        if found:
            return found
    return None


def _first_line(exc: BaseException | None) -> str:
    return str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else repr(exc)


# --- PgBouncer and Redis -----------------------------------------------------


def require_pgbouncer() -> str:
    """The ``pgbouncer`` binary :func:`pgbouncer` would start; if none, :class:`ServerNotFoundError`."""
    binary = _which("pgbouncer", extra_dirs=("/usr/sbin", "/usr/local/bin"))
    if binary is None:
        raise ServerNotFoundError(
            f"no pgbouncer binary: install the Debian package 'pgbouncer' (it need not be running), "
            f"or set {ENV_PGBOUNCER}"
        )
    return binary


def _unique_statement_name() -> str:
    return f"__asyncpg_{uuid.uuid4().hex}__"


#: ``connect_args`` of an asyncpg engine behind this PgBouncer (1.18: no prepared statements in
#: transaction pooling): no statement caches, and a name of its own for every prepared statement,
#: so that two clients sharing one server connection never clash on asyncpg's numbered names
#: (SQLAlchemy's asyncpg dialect docs, "Prepared Statement Name with PGBouncer"). An import path
#: to it is what Airflow's ``[database] sql_alchemy_connect_args_async`` takes.
ASYNCPG_CONNECT_ARGS: dict[str, Any] = {
    "prepared_statement_cache_size": 0,
    "statement_cache_size": 0,
    "prepared_statement_name_func": _unique_statement_name,
}


@contextlib.contextmanager
def pgbouncer(
    server_url: str | URL, *, pool_mode: str = "transaction", stats_users: Sequence[str] = ()
) -> Iterator[str]:
    """Yield the URL of a throwaway PgBouncer in front of the PostgreSQL server at ``server_url``.

    ``transaction`` pooling (the official Helm chart's default in front of Airflow's database):
    session state (``SET``, prepared statements, advisory locks) does not survive from one
    transaction to the next. Every database name goes to that server, as the same user, trusted.
    ``stats_users`` may run ``SHOW`` on its admin console (database ``pgbouncer``). With
    ``$ADRQ_TEST_PGBOUNCER_URL`` set, yields that PgBouncer's URL (the driver and user of
    ``server_url``) instead of starting one.
    """
    upstream = sa.make_url(server_url)
    explicit = os.environ.get(ENV_PGBOUNCER, "").strip()
    if explicit:
        given = sa.make_url(explicit)
        yield upstream.set(host=given.host, port=given.port).render_as_string(hide_password=False)
        return
    binary = require_pgbouncer()
    with _scratch("pgbouncer", "postgres") as (tmp, as_user):
        port, user = free_port(), upstream.username or "postgres"
        (tmp / "userlist.txt").write_text(f'"{user}" ""\n')
        (tmp / "pgbouncer.ini").write_text(
            f"""\
[databases]
* = host={upstream.host or "127.0.0.1"} port={upstream.port or 5432} user={user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {tmp / "userlist.txt"}
pool_mode = {pool_mode}
stats_users = {",".join(stats_users)}
max_client_conn = 500
default_pool_size = 60
; Drivers send these at connect; PgBouncer must not refuse them.
ignore_startup_parameters = extra_float_digits,options
pidfile = {tmp / "pgbouncer.pid"}
logfile = {tmp / "pgbouncer.log"}
"""
        )
        executor = _executor([binary, str(tmp / "pgbouncer.ini")], port, signal.SIGINT, as_user)
        with _running(executor, "PgBouncer", tmp / "pgbouncer.log"):
            yield upstream.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


@contextlib.contextmanager
def redis() -> Iterator[str]:
    """Yield the URL (``redis://127.0.0.1:<port>``) of a throwaway Redis: loopback only, no persistence;
    :class:`ServerNotFoundError` naming the Debian package when ``redis-server`` is missing."""
    binary = _which("redis-server", extra_dirs=("/usr/bin", "/usr/local/bin"))
    if binary is None:
        raise ServerNotFoundError("no redis-server binary: install the Debian package 'redis-server'")
    with _scratch("redis", "redis") as (tmp, as_user):
        port = free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--dir", str(tmp), "--logfile", str(tmp / "redis.log")]
        with _running(
            _executor(command, port, signal.SIGTERM, as_user), "the throwaway Redis", tmp / "redis.log"
        ):
            yield f"redis://127.0.0.1:{port}"


# --- the backend table -------------------------------------------------------

_BACKENDS: dict[str, _Backend] = {
    "postgresql": _Backend(
        name="postgresql",
        label="PostgreSQL",
        env_var="ADRQ_TEST_POSTGRESQL_URL",
        debian_package="postgresql",
        example_url="postgresql+psycopg2://user:password@host:5432/dbname",
        local_urls=(
            "postgresql+psycopg2://root@127.0.0.1:5432/test",
            "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres",
        ),
        version_sql="SHOW server_version",
        create_sql="CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'",
        drop_sql="DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        start=start_postgresql,
        driver_hint="psycopg2 (pip install 'airflow-adrq[postgres]')",
    ),
    "mysql": _Backend(
        name="mysql",
        label="MySQL/MariaDB",
        env_var="ADRQ_TEST_MYSQL_URL",
        debian_package="mariadb-server",
        example_url="mysql+mysqldb://user:password@host:3306/dbname",
        local_urls=("mysql+mysqldb://root@127.0.0.1:3306/test",),
        version_sql="SELECT VERSION()",
        create_sql="CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
        drop_sql="DROP DATABASE IF EXISTS {name}",
        start=start_mysql,
        driver_hint="mysqlclient (pip install 'airflow-adrq[mysql]')",
    ),
}


def _backend(name: str) -> _Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown server backend {name!r} (known: {', '.join(BACKENDS)})") from None


def _backend_for_url(url: str | URL) -> _Backend:
    name = sa.make_url(url).get_backend_name()
    # MariaDB URLs (mariadb+mysqldb://) are served by the MySQL entry.
    return _backend("mysql" if name == "mariadb" else name)
