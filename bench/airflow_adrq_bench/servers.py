"""Find (or start) a PostgreSQL or MySQL/MariaDB server for tests and benchmarks.

:func:`discover` looks for a server in this order and stops at the first that
answers:

1. the URL in ``ADRQ_TEST_POSTGRESQL_URL`` / ``ADRQ_TEST_MYSQL_URL``. When it
   is set it is the only candidate: a server named explicitly that does not
   answer is an error, never a silent fallback to another one;
2. a server already running on ``127.0.0.1`` with the usual trust/empty-password
   accounts (``root`` or ``postgres`` on 5432; ``root`` on 3306). Set
   ``ADRQ_TEST_NO_LOCAL=1`` to skip this step;
3. a throwaway server started from the locally installed binaries in a fresh
   temporary directory on a free port, with durability switched off. It is
   stopped and its directory removed when the context manager exits.

Nothing here is used by the queueing code: this module exists so that the test
suite and ``airflow-adrq bench`` find servers the same way. On a server it did
not start it only creates and drops the databases its callers name
(:func:`create_database`, :func:`drop_database`).

Running as root: ``initdb``/``postgres`` refuse to run as root and ``mariadbd``
only does with ``--user``, so a throwaway server started by root runs as the
``postgres`` / ``mysql`` account (``nobody`` when that does not exist), which
then owns its temporary directory.

The server processes are driven by mirakuru's ``TCPExecutor`` (start, wait for
the port, stop, kill leftovers at exit) rather than by the executors of
pytest-postgresql and pytest-mysql built on it: ``PostgreSQLExecutor`` runs
every step through ``pg_ctl``, which refuses to run as root, with no way to run
those steps as another user; ``MySQLExecutor`` starts ``mysqld_safe``, whose
``--no-defaults`` must be the first argument, which the executor does not allow,
so the machine's ``/etc/mysql`` configuration would leak into the throwaway server.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from airflow_adrq.errors import AdrqError

__all__ = [
    "ASYNCPG_CONNECT_ARGS",
    "BACKENDS",
    "ENV_NO_LOCAL",
    "ServerBackend",
    "ServerInfo",
    "ServerNotFoundError",
    "create_database",
    "discover",
    "drop_database",
    "env_var",
    "pgbouncer",
    "redis",
    "require_pgbouncer",
    "server_version",
]

ServerBackend = Literal["postgresql", "mysql"]
BACKENDS: tuple[ServerBackend, ...] = ("postgresql", "mysql")

#: Set to ``1`` to ignore servers already running on 127.0.0.1 (step 2).
ENV_NO_LOCAL = "ADRQ_TEST_NO_LOCAL"

# Seconds to wait for a connection to a candidate server. Local servers answer
# in milliseconds; a firewalled port must not stall a test session.
CONNECT_TIMEOUT = 3
# Seconds a throwaway server gets to start accepting connections.
START_TIMEOUT = 60

# Database names we create or drop: lower-case, no quoting surprises on any
# backend, and short enough for PostgreSQL (63) and MySQL (64).
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class ServerNotFoundError(AdrqError):
    """No database server could be found or started for this backend."""


@dataclass(frozen=True)
class ServerInfo:
    """A server that answered, and how it was found.

    ``url`` connects as a superuser to a maintenance database; it is a plain
    string (password included) so it can be handed to other processes.
    """

    backend: ServerBackend
    url: str
    version: str
    how_found: str

    def database_url(self, name: str) -> str:
        """The URL of database ``name`` on this server."""
        url = sa.make_url(self.url).set(database=name)
        return url.render_as_string(hide_password=False)


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
    """Yield a reachable server for ``backend`` (see the module docstring for the order).

    A throwaway server is stopped, and its directory removed, when the context
    exits. Raises :class:`ServerNotFoundError` naming the Debian package to
    install and the variable to set when every step fails.
    """
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
                tried.append(f"{_safe(candidate)}: {_first_line(exc.orig)}")
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
    """Connect to ``url`` and return the server's version, e.g. ``"PostgreSQL 15.14"``.

    Raises the driver's error (wrapped by SQLAlchemy) when nothing answers.
    """
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
    """Create an empty database ``name`` on the server and return its URL.

    PostgreSQL copies ``template0`` with UTF8 encoding, so nothing added to
    ``template1`` leaks in; MySQL/MariaDB use ``utf8mb4`` as Airflow's docs
    ask. Fails if the database exists. ``name`` must match ``[a-z_][a-z0-9_]*``.
    """
    _run_ddl(server_url, _backend_for_url(server_url).create_sql, name)
    url = sa.make_url(server_url).set(database=name)
    return url.render_as_string(hide_password=False)


def drop_database(server_url: str | URL, name: str) -> None:
    """Drop database ``name`` if it exists.

    PostgreSQL disconnects sessions still using it (``WITH (FORCE)``, PG 13+);
    MySQL/MariaDB wait for them to release their metadata locks.
    """
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


def start_postgresql(
    settings: Mapping[str, str] | None = None,
) -> contextlib.AbstractContextManager[ServerInfo]:
    """A throwaway PostgreSQL from the installed binaries; ``settings``: more ``-c name=value``."""
    bindir = _find_postgresql_bindir()
    extra = [arg for name, value in (settings or {}).items() for arg in ("-c", f"{name}={value}")]
    return _run_throwaway(
        backend="postgresql",
        account="postgres",
        initialise=lambda data, tmp: [
            str(bindir / "initdb"),
            f"--pgdata={data}",
            "--username=postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ],
        command=lambda data, tmp, port: [
            str(bindir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(tmp),
            "-c",
            "listen_addresses=127.0.0.1",
            # A throwaway server: durability off, enough connections for
            # concurrency tests run by two xdist workers at once.
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
            *extra,
        ],
        # SIGINT is PostgreSQL's "fast" shutdown: it does not wait for clients
        # to disconnect (SIGTERM, the "smart" one, would).
        stop_signal=signal.SIGINT,
        url=lambda port: f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres",
        binary=bindir / "postgres",
    )


def _find_postgresql_bindir() -> Path:
    # Debian/Ubuntu keep the server binaries out of PATH, one directory per
    # major version; prefer the newest. Elsewhere (Homebrew, RPMs) they are on PATH.
    candidates = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: _version_key(p.parent.name),
        reverse=True,
    )
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "postgres").is_file():
            return bindir
    raise ServerNotFoundError(
        "no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin or on PATH"
    )


def _start_mysql() -> contextlib.AbstractContextManager[ServerInfo]:
    mysqld = _which("mariadbd", "mysqld", extra_dirs=("/usr/sbin", "/usr/libexec", "/usr/local/mysql/bin"))
    if mysqld is None:
        raise ServerNotFoundError("no MariaDB/MySQL server binary (mariadbd or mysqld) found")
    is_mariadb = (
        "mariadb"
        in subprocess.run([mysqld, "--version"], capture_output=True, text=True, check=False).stdout.lower()
    )
    if is_mariadb:
        install_db = _which("mariadb-install-db", "mysql_install_db", extra_dirs=("/usr/bin",))
        if install_db is None:
            raise ServerNotFoundError("mariadbd found but not mariadb-install-db")

        def initialise(data: Path, tmp: Path) -> list[str]:
            return [
                str(install_db),
                "--no-defaults",
                f"--datadir={data}",
                "--auth-root-authentication-method=normal",  # root, no password
                "--skip-test-db",
                "--skip-name-resolve",  # grants for 127.0.0.1 without a DNS lookup
            ]

        extra: list[str] = []
    else:
        # MySQL 8 initialises its own data directory. Written from MySQL's
        # manual; only MariaDB is installable on the machines we test on.
        def initialise(data: Path, tmp: Path) -> list[str]:
            return [str(mysqld), "--no-defaults", "--initialize-insecure", f"--datadir={data}"]

        extra = ["--mysqlx=OFF"]  # X Protocol would claim port 33060 too

    return _run_throwaway(
        backend="mysql",
        account="mysql",
        initialise=initialise,
        command=lambda data, tmp, port: [
            str(mysqld),
            "--no-defaults",  # must come first: ignore /etc/mysql
            f"--datadir={data}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--socket={tmp / 'mysqld.sock'}",
            f"--pid-file={tmp / 'mysqld.pid'}",
            f"--tmpdir={tmp}",
            "--skip-log-bin",
            # A throwaway server: no flush at each commit.
            "--innodb-flush-log-at-trx-commit=0",
            "--max-connections=300",
            *extra,
        ],
        stop_signal=signal.SIGTERM,
        url=lambda port: f"mysql+mysqldb://root@127.0.0.1:{port}/",
        binary=Path(mysqld),
    )


def _which(*names: str, extra_dirs: Sequence[str]) -> str | None:
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(extra_dirs))
        if found:
            return found
    return None


@contextlib.contextmanager
def _run_throwaway(
    *,
    backend: ServerBackend,
    account: str,
    initialise: Callable[[Path, Path], list[str]],
    command: Callable[[Path, Path, int], list[str]],
    stop_signal: int,
    url: Callable[[int], str],
    binary: Path,
) -> Iterator[ServerInfo]:
    _require_mirakuru("a throwaway server")
    as_user = _unprivileged_account(account)
    tmp = Path(tempfile.mkdtemp(prefix=f"adrq-{backend}-"))
    try:
        if as_user is not None:
            os.chown(tmp, as_user.pw_uid, as_user.pw_gid)
        data = tmp / "data"
        log_path = tmp / "server.log"
        with log_path.open("w") as log:
            init = subprocess.run(
                initialise(data, tmp),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                **_popen_user(as_user),
            )
            if init.returncode != 0:
                raise ServerNotFoundError(
                    f"initialising a throwaway {backend} data directory failed:\n{_tail(log_path)}"
                )
            port = _free_port()
            with _listening(
                command(data, tmp, port),
                port,
                stop_signal=stop_signal,
                output=log,
                as_user=as_user,
                what=f"the throwaway {backend} server",
                log_path=log_path,
            ):
                server_url = url(port)
                version = server_version(server_url)
                who = f" as user {as_user.pw_name}" if as_user is not None else ""
                yield ServerInfo(
                    backend, server_url, version, f"throwaway server from {binary}{who}, 127.0.0.1:{port}"
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _require_mirakuru(what: str) -> None:
    """Refuse before any directory is made or binary run: mirakuru drives every server started here."""
    if importlib.util.find_spec("mirakuru") is None:
        raise ServerNotFoundError(f"starting {what} needs mirakuru (pip install 'airflow-adrq[test]')")


@contextlib.contextmanager
def _listening(
    command: list[str],
    port: int,
    *,
    stop_signal: int,
    output: IO[str] | int,
    as_user: pwd.struct_passwd | None,
    what: str,
    log_path: Path,
) -> Iterator[None]:
    """Run ``command`` until it accepts connections on 127.0.0.1:``port``; stop it on leaving.

    Raises :class:`ServerNotFoundError` with the tail of ``log_path`` when it
    does not start within :data:`START_TIMEOUT`.
    """
    from mirakuru import TCPExecutor
    from mirakuru.exceptions import ExecutorError

    executor = TCPExecutor(
        command,
        host="127.0.0.1",
        port=port,
        timeout=START_TIMEOUT,
        stop_signal=stop_signal,
        # Never a pipe: nobody reads it, and a full pipe blocks the server.
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        popen_kwargs=_popen_user(as_user),
    )
    try:
        executor.start()
    except ExecutorError as exc:
        with contextlib.suppress(ExecutorError, OSError):
            executor.stop()
        raise ServerNotFoundError(f"{what} did not start:\n{_tail(log_path)}") from exc
    try:
        yield
    finally:
        executor.stop()


def _unprivileged_account(preferred: str) -> pwd.struct_passwd | None:
    """The account to run a server as when we are root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in (preferred, "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServerNotFoundError(f"running as root and neither a {preferred!r} nor a 'nobody' account exists")


def _popen_user(account: pwd.struct_passwd | None) -> dict[str, Any]:
    if account is None:
        return {}
    # Drop supplementary groups too: root's would otherwise be kept.
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _free_port() -> int:
    # The kernel picks a free port; the tiny window before the server binds it
    # is acceptable for a test server (a clash fails loudly at start).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _first_line(exc: BaseException | None) -> str:
    return str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else repr(exc)


def _safe(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


# --- PgBouncer ---------------------------------------------------------------

#: Names the PgBouncer to use instead of starting one (its pool_mode must be
#: ``transaction`` for the tests that rely on it).
ENV_PGBOUNCER = "ADRQ_TEST_PGBOUNCER_URL"


def require_pgbouncer() -> str:
    """The ``pgbouncer`` binary :func:`pgbouncer` would start; raises :class:`ServerNotFoundError`
    naming the Debian package when there is none (or mirakuru, which drives it, is missing)."""
    binary = _which("pgbouncer", extra_dirs=("/usr/sbin", "/usr/local/bin"))
    if binary is None:
        raise ServerNotFoundError(
            f"no pgbouncer binary: install the Debian package 'pgbouncer' (it need not be running), "
            f"or set {ENV_PGBOUNCER}"
        )
    _require_mirakuru("PgBouncer")
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

    ``transaction`` pooling (the official Helm chart's default in front of
    Airflow's database): a client holds a server connection only for the
    length of a transaction, so session state (``SET``, prepared statements,
    advisory locks) does not survive from one transaction to the next. Every
    database name is forwarded to the same server, as the same user, with
    trust authentication (a test setup). Runs as the ``postgres`` account when
    started by root (PgBouncer refuses to run as root). Raises
    :class:`ServerNotFoundError` naming the Debian package when the
    ``pgbouncer`` binary is missing. ``stats_users`` may run ``SHOW``
    commands on its admin console (database ``pgbouncer``). With
    ``$ADRQ_TEST_PGBOUNCER_URL`` set, yields that PgBouncer's URL (same
    driver and user as ``server_url``) instead of starting one.
    """
    upstream = sa.make_url(server_url)
    explicit = os.environ.get(ENV_PGBOUNCER, "").strip()
    if explicit:
        given = sa.make_url(explicit)
        yield upstream.set(host=given.host, port=given.port).render_as_string(hide_password=False)
        return
    binary = require_pgbouncer()
    as_user = _unprivileged_account("postgres")
    tmp = Path(tempfile.mkdtemp(prefix="adrq-pgbouncer-"))
    try:
        port = _free_port()
        user = upstream.username or "postgres"
        (tmp / "userlist.txt").write_text(f'"{user}" ""\n')
        (tmp / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={upstream.host or '127.0.0.1'} port={upstream.port or 5432} user={user}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {tmp / 'userlist.txt'}",
                    f"pool_mode = {pool_mode}",
                    f"stats_users = {','.join(stats_users)}",
                    "max_client_conn = 500",
                    "default_pool_size = 60",
                    # Drivers send these at connect; PgBouncer must not refuse them.
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"pidfile = {tmp / 'pgbouncer.pid'}",
                    f"logfile = {tmp / 'pgbouncer.log'}",
                    "",
                ]
            )
        )
        if as_user is not None:
            for path in (tmp, *tmp.iterdir()):
                os.chown(path, as_user.pw_uid, as_user.pw_gid)
        with _listening(
            [binary, str(tmp / "pgbouncer.ini")],
            port,
            stop_signal=signal.SIGINT,
            # PgBouncer writes its own log file (logfile above).
            output=subprocess.DEVNULL,
            as_user=as_user,
            what="PgBouncer",
            log_path=tmp / "pgbouncer.log",
        ):
            yield upstream.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- Redis -------------------------------------------------------------------


@contextlib.contextmanager
def redis() -> Iterator[str]:
    """Yield the URL (``redis://127.0.0.1:<port>``) of a throwaway Redis server, stopped on leaving.

    Loopback only, no persistence, its files in a temporary directory; run
    as the ``redis`` account (or ``nobody``) when started by root. Raises
    :class:`ServerNotFoundError` naming the Debian package when the
    ``redis-server`` binary is missing.
    """
    binary = _which("redis-server", extra_dirs=("/usr/bin", "/usr/local/bin"))
    if binary is None:
        raise ServerNotFoundError("no redis-server binary: install the Debian package 'redis-server'")
    _require_mirakuru("a throwaway Redis")
    as_user = _unprivileged_account("redis")
    tmp = Path(tempfile.mkdtemp(prefix="adrq-redis-"))
    try:
        if as_user is not None:
            os.chown(tmp, as_user.pw_uid, as_user.pw_gid)
        port = _free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with _listening(
            [*command, "--dir", str(tmp), "--logfile", str(tmp / "redis.log")],
            port,
            stop_signal=signal.SIGTERM,
            output=subprocess.DEVNULL,
            as_user=as_user,
            what="the throwaway Redis",
            log_path=tmp / "redis.log",
        ):
            yield f"redis://127.0.0.1:{port}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        start=_start_mysql,
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
