"""One scratch Airflow deployment: its settings, its components as child processes, and their end.

A :class:`Deployment` is one manager on one scratch database. It writes only
its scratch ``AIRFLOW_HOME`` and log folder, binds only ``127.0.0.1`` (the
scheduler's log server off), and runs this environment's ``airflow`` CLI, so
the controller never imports Airflow. Every component gets the same settings
and none of the caller's: one JWT secret, API secret key and Fernet key per
deployment, and the run's :class:`~.config.LiveShape` (LocalExecutor, or
CeleryExecutor with workers on a broker database and a queue of its own; the
api-server's workers; with PgBouncer, every component but ``db migrate``
through a throwaway PgBouncer in transaction pooling).

Each component leads a process group of its own, so :meth:`Deployment.stop`
ends the whole group: SIGTERM, then SIGKILL after a grace period. The task SDK
moves each task into a group of its own, so a last sweep ends (by pid) every
process whose environment carries this deployment's ``ADRQ_LIVE_DEPLOYMENT``.
``stop`` runs on success, failure, time-out and Ctrl-C.
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from airflow_adrq_bench.airflow_mode.live import scaleout
from airflow_adrq_bench.airflow_mode.live.config import EXECUTORS, LiveError, LiveShape, LiveSizes
from airflow_adrq_bench.airflow_mode.processes import airflow_command, start_migrate, wait_migrate
from airflow_adrq_testing.servers import free_port

# airflow_command and free_port: where the live mode's modules have always found them.
__all__ = ["MARKER", "Component", "Deployment", "airflow_command", "free_port"]

#: The environment variable that marks every process of a deployment (its value: the deployment's id).
MARKER: Final = "ADRQ_LIVE_DEPLOYMENT"

# Seconds a process group gets between SIGTERM and SIGKILL.
_GRACE_S: Final = 30.0
# The import path of the asyncpg connect_args behind PgBouncer ([database] sql_alchemy_connect_args_async).
_ASYNC_CONNECT_ARGS: Final = "airflow_adrq_testing.servers.ASYNCPG_CONNECT_ARGS"
# Stop order: schedulers first (no new task starts), then the Celery workers (their running tasks
# still report to the api-server), the DAG processor, the api-server last.
_STOP_ORDER: Final = {"celery-worker": 1, "dag-processor": 2, "api-server": 3}


@dataclass
class Component:
    """One started ``airflow`` command: its process (a group leader) and its log file."""

    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes]
    _log_file: IO[bytes] = field(repr=False)

    def exited(self) -> int | None:
        """Its exit status, or None while it runs."""
        return self.process.poll()


class Deployment:
    """One manager's Airflow on one scratch database (see the module docstring).

    ``url`` is the scratch database's SQLAlchemy URL with the sync driver
    Airflow uses (``postgresql+psycopg2``, ``mysql+mysqldb``); ``server_url``
    its server's (where a PgBouncer points); ``home`` the scratch
    ``AIRFLOW_HOME`` (DAG files, task logs); ``log_dir`` where the components'
    own output goes.
    """

    def __init__(
        self,
        *,
        name: str,
        backend: str,
        url: str,
        manager_class: str,
        sizes: LiveSizes,
        home: Path,
        log_dir: Path,
        manager_kwargs: str | None = None,
        shape: LiveShape | None = None,
        server_url: str = "",
    ) -> None:
        self.name = name
        self.backend = backend
        self.url = url
        self.server_url = server_url
        self.sizes = sizes
        self.shape = shape or LiveShape()
        self.home = home
        self.log_dir = log_dir
        self.dags_folder = home / "dags"
        self.barrier_dir = home / "barrier"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.id = uuid.uuid4().hex
        self.broker_url = scaleout.broker_url(self.shape) if self.shape.celery else None
        self.components: list[Component] = []
        self.env = self._environment(manager_class, manager_kwargs)
        self.stopped = False
        # What stop() ends after the components: the PgBouncer.
        self._servers = contextlib.ExitStack()

    # --- settings ---------------------------------------------------------------------

    def _environment(self, manager_class: str, manager_kwargs: str | None) -> dict[str, str]:
        """The variables every component gets: the caller's, minus any Airflow setting, plus ours."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        sizes = self.sizes
        settings = {
            "AIRFLOW_HOME": str(self.home),
            **self._database(self.url),
            "AIRFLOW__CORE__EXECUTOR": EXECUTORS[self.shape.executor],
            # Every producer task of a burst runs at once (plus nothing else: the
            # consumers' EmptyOperator never reaches the executor).
            "AIRFLOW__CORE__PARALLELISM": str(max(sizes.tasks_per_burst, 4)),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(max(sizes.tasks_per_burst, 16)),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__ASSET_MANAGER_CLASS": manager_class,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": f"{self.base_url}/",
            "AIRFLOW__API__WORKERS": str(self.shape.api_workers),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # >= 64 bytes, or PyJWT warns InsecureKeyLengthWarning on every token.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            # Nothing may listen beyond 127.0.0.1 (the health server binds 0.0.0.0).
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # The access log (HttpAccessLogMiddleware, logger http.access) logs at INFO.
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            MARKER: self.id,
        }
        if manager_kwargs is not None:
            settings["AIRFLOW__CORE__ASSET_MANAGER_KWARGS"] = manager_kwargs
        if self.shape.reparse_s:
            settings["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] = str(self.shape.reparse_s)
        if self.broker_url is not None:
            settings.update(self._celery(self.broker_url))
        if self.shape.pgbouncer:
            # asyncpg's numbered prepared statements clash behind transaction pooling.
            settings["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = _ASYNC_CONNECT_ARGS
        if self.backend == "mysql":
            # 3.3.2's scheduler exits on MariaDB at its first orphan clean-up (60 s):
            # _update_asset_orphanage sends WITH ... DELETE ... RETURNING (error 1064).
            settings["AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL"] = "86400"
        env.update(settings)
        return env

    def _database(self, url: str) -> dict[str, str]:
        """The settings that name the database: Airflow's, and Celery's result backend there."""
        settings = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
        if self.shape.celery:
            # With the driver named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3.
            settings["AIRFLOW__CELERY__RESULT_BACKEND"] = f"db+{url}"
        return settings

    def _celery(self, broker_url: str) -> dict[str, str]:
        """CeleryExecutor's settings: the broker, and a queue of this deployment's own on it."""
        workers = self.shape.celery_workers
        return {
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            # The tasks' queue and the one the workers consume (a stale message of another
            # deployment on the same broker database never reaches these workers).
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": f"adrq-live-{self.id[:12]}",
            # Every producer task of a burst runs at once, as with LocalExecutor.
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(math.ceil(self.sizes.tasks_per_burst / workers)),
        }

    @property
    def shape_info(self) -> dict[str, object]:
        """The deployment's shape as the report names it (its own scheduler count, its broker)."""
        broker = None if self.broker_url is None else scaleout.redacted(self.broker_url)
        return {**self.shape.describe(self.schedulers), "broker_url": broker}

    # --- processes --------------------------------------------------------------------

    def migrate(self, timeout: float) -> None:
        """``airflow db migrate``: Airflow's own schema on the scratch database, as an operator makes it."""
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / "db-migrate.log"
        # Directly: the migration's advisory lock is session state, which PgBouncer's
        # transaction pooling does not keep.
        wait_migrate(start_migrate({**self.env, **self._database(self.url)}, log), log, timeout)

    def start(self) -> None:
        """Start the PgBouncer (with one), the api-server, the scheduler(s), the DAG processor and the
        Celery workers (with CeleryExecutor), in that order."""
        pooled = self._servers.enter_context(scaleout.pooled(self.shape, self.url, self.server_url))
        self.env.update(self._database(pooled))
        self._start("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(self.port)])
        for index in range(self.schedulers):
            suffix = f"-{index + 1}" if self.schedulers > 1 else ""
            self._start(f"scheduler{suffix}", ["scheduler", "--skip-serve-logs"])
        self._start("dag-processor", ["dag-processor"])
        for index in range(self.shape.celery_workers if self.shape.celery else 0):
            hostname = f"w{index + 1}@{self.id}"
            self._start(
                f"celery-worker-{index + 1}",
                ["celery", "worker", "--skip-serve-logs", "--celery-hostname", hostname],
            )

    @property
    def schedulers(self) -> int:
        """``sizes.schedulers``, but one on MySQL/MariaDB (HA mode is measured on PostgreSQL)."""
        return self.sizes.schedulers if self.backend == "postgresql" else 1

    def _start(self, name: str, args: list[str]) -> None:
        log = self.log_dir / f"{name}.log"
        log_file = log.open("ab")
        argv = [*airflow_command(), *args]
        try:
            process = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        self.components.append(Component(name, argv, log, process, log_file))

    def log_of(self, name: str) -> Path:
        """The log file of component ``name`` (``api-server``, ``scheduler``, ``dag-processor`` ...)."""
        return self.log_dir / f"{name}.log"

    def check_alive(self) -> None:
        """Raise :class:`LiveError` naming the component and its log if one has exited."""
        for component in self.components:
            status = component.exited()
            if status is not None:
                tail = _tail(component.log, 1500)
                raise LiveError(
                    f"{component.name} exited with status {status} (log: {component.log}; "
                    f"api-server log: {self.log_of('api-server')}):\n{tail}"
                )

    def stop(self) -> list[str]:
        """Stop everything this deployment started; returns what needed SIGKILL (empty: nothing did).

        Schedulers first (no new task starts), then the Celery workers, the
        DAG processor, the api-server (running tasks still report to it):
        SIGTERM to each process group, then SIGKILL to the groups still there
        after the grace period, then a sweep of processes carrying the
        deployment's marker; the PgBouncer last.
        """
        if self.stopped:
            return []
        self.stopped = True
        killed: list[str] = []
        order = sorted(self.components, key=_stop_rank)
        for component in order:
            _signal_group(component.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for component in order:
            with contextlib.suppress(subprocess.TimeoutExpired):
                component.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for component in order:
            if component.process.poll() is None:
                killed.append(component.name)
            # The group may outlive its leader (executor workers): kill it in any case.
            _signal_group(component.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                component.process.wait(timeout=10)
            component._log_file.close()
        leftovers = list(_marked_processes(self.id))
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if leftovers:
            killed.append(f"{len(leftovers)} task process(es) by pid")
        self._servers.close()
        return killed

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_rank(component: Component) -> int:
    return next((rank for prefix, rank in _STOP_ORDER.items() if component.name.startswith(prefix)), 0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _marked_processes(deployment_id: str) -> Iterator[int]:
    """Pids of this user's processes whose environment carries ``MARKER=deployment_id``."""
    needle = f"{MARKER}={deployment_id}".encode()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            yield int(entry.name)


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
