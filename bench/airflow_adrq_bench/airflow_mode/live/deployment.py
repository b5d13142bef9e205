"""One manager's Airflow deployment on a scratch database of its own: its settings, processes and end.

Every component runs this environment's ``airflow`` CLI in a process group of its own, with the same
settings (and none of the caller's), binds only ``127.0.0.1`` and writes its own log. :func:`check`
runs before the first deployment: a missing piece of a shape is an error naming the fix, not a
component dying in the middle of a run.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import importlib
import itertools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import psutil
import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode import processes
from airflow_adrq_bench.airflow_mode.config import (
    EXECUTORS,
    MANAGER_CLASSES,
    WARM_DAG,
    LiveError,
    LiveShape,
    LiveSizes,
)
from airflow_adrq_bench.airflow_mode.databases import airflow_url
from airflow_adrq_testing import servers
from airflow_adrq_testing.dataset import Target

#: The environment variable that marks every process of a deployment (its value: the deployment's id).
MARKER: Final = "ADRQ_LIVE_DEPLOYMENT"
#: What installs CeleryExecutor here (provider 3.26.0 fails to import with celery 5.7:
#: ``cannot import name 'retry' from 'celery.backends.database'``).
CELERY_INSTALL: Final = "pip install apache-airflow-providers-celery 'celery[redis]<5.7'"
#: The module the scheduler's CeleryExecutor and ``airflow celery worker`` import first.
CELERY_MODULE: Final = "airflow.providers.celery.executors.celery_executor"
#: The default broker: the local Redis (``--broker-url`` names another).
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379"

# Stop order: schedulers first (no new task starts), then the Celery workers (their running tasks
# still report to the api-server), the DAG processor, the api-server last.
_STOP_ORDER: Final = ("scheduler", "celery-worker", "dag-processor", "api-server")
# Redis databases 1..15 in turn, one per deployment of this process (0 is left to other users).
_REDIS_DBS = itertools.count()


def check(shape: LiveShape, targets: Sequence[Target]) -> None:
    """Raise :class:`LiveError` naming the fix when this environment cannot run ``shape`` on ``targets``."""
    others = [t.name for t in targets if t.backend != "postgresql"]
    if shape.pgbouncer and others:
        raise LiveError(
            f"--pgbouncer is PostgreSQL only (PgBouncer speaks PostgreSQL's protocol), not "
            f"{', '.join(others)}: add --backend postgresql, or give PostgreSQL --db URLs only"
        )
    if shape.pgbouncer and not os.environ.get(servers.ENV_PGBOUNCER, "").strip():  # else that one is used
        try:
            servers.require_pgbouncer()
        except servers.ServerNotFoundError as exc:
            raise LiveError(f"--pgbouncer: {exc}") from None
    if shape.celery:
        check_celery(shape.broker_url or f"{DEFAULT_REDIS}/0")


def check_celery(broker: str, module: str = CELERY_MODULE) -> None:
    """Raise :class:`LiveError` naming the fix unless this environment's Python imports ``module`` (in a
    child interpreter with a scratch ``AIRFLOW_HOME``, where importing Airflow writes its configuration,
    and no ``AIRFLOW_*`` settings) and connects to the Celery broker at ``broker``."""
    with tempfile.TemporaryDirectory(prefix="adrq-live-celery-check-") as home:
        argv = [sys.executable, "-c", f"import {module}"]
        env = processes.clean_environ({"AIRFLOW_HOME": home})
        try:
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            raise LiveError(f"importing {module} took over 180 s") from None
    if result.returncode != 0:
        error = (result.stderr.strip().splitlines() or ["?"])[-1]
        raise LiveError(
            f"--executor celery: this environment cannot import {module} ({error}): {CELERY_INSTALL}"
        )
    # Connect as the workers do: kombu (Redis answers PING, after AUTH with a password in the URL);
    # imported by name, as it comes with Celery, which only this shape needs.
    try:
        with importlib.import_module("kombu").Connection(broker, connect_timeout=3) as connection:
            connection.connect()
    except Exception as exc:
        start = "start Redis (Debian package redis-server)" if broker.startswith("redis") else "start it"
        raise LiveError(  # str() of a URL hides its password
            f"the Celery broker {sa.make_url(broker)!s} does not answer ({type(exc).__name__}: {exc}): "
            f"{start}, or name a running broker with --broker-url"
        ) from None


@dataclasses.dataclass(eq=False)
class Deployment:
    """One manager's Airflow on a scratch database of ``target``'s server, made (with its DAG files) on
    entering. Leaving stops every process, drops the database and removes the scratch ``AIRFLOW_HOME``;
    ``keep_scratch`` keeps both, a failure other than Ctrl-C keeps the home (DAG files, task logs)."""

    target: Target
    manager: str
    sizes: LiveSizes
    shape: LiveShape
    log_dir: Path
    manager_kwargs: str | None = None
    keep_scratch: bool = False

    def __post_init__(self) -> None:
        self.database = f"adrq_live_{self.manager}_{secrets.token_hex(3)}"
        self.home = Path(tempfile.mkdtemp(prefix=f"adrq-live-{self.log_dir.name}-"))
        self.port = servers.free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.id = uuid.uuid4().hex
        self.broker_url = None
        if self.shape.celery:
            self.broker_url = self.shape.broker_url or f"{DEFAULT_REDIS}/{1 + next(_REDIS_DBS) % 15}"
        # MySQL/MariaDB get one scheduler (HA mode is measured on PostgreSQL).
        self.schedulers = self.sizes.schedulers if self.target.backend == "postgresql" else 1
        self.components: dict[str, subprocess.Popen[bytes]] = {}  # each a process group leader
        self.url = ""  # made on entering, with the settings
        self.env: dict[str, str] = {}
        self.kept: dict[str, str | None] | None = None
        self._pgbouncer = contextlib.ExitStack()

    def __enter__(self) -> Deployment:
        try:
            self.url = airflow_url(servers.create_database(self.target.server_url, self.database))
            write_dag_files(self.home / "dags", self.home / "barrier", self.sizes)
        except BaseException:
            shutil.rmtree(self.home, ignore_errors=True)
            raise
        self.env = processes.clean_environ(self._settings(self.url))
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.stop()
        if not self.keep_scratch:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                servers.drop_database(self.target.server_url, self.database)
        if self.keep_scratch or (kind is not None and not issubclass(kind, KeyboardInterrupt)):
            self.kept = {"home": str(self.home), "database": self.database if self.keep_scratch else None}
        else:
            shutil.rmtree(self.home, ignore_errors=True)

    @property
    def shape_info(self) -> dict[str, object]:
        """The shape as the report names it (this deployment's scheduler count, its broker minus password)."""
        return {
            **dataclasses.asdict(self.shape),
            "executor": EXECUTORS[self.shape.executor],
            "celery_workers": self.shape.celery_workers if self.shape.celery else 0,
            "schedulers": self.schedulers,
            "broker_url": None if self.broker_url is None else str(sa.make_url(self.broker_url)),
        }

    @property
    def database_port(self) -> int | None:
        """The TCP port the components reach the database at (PgBouncer's once started with one; the
        server's default where the URL names none); None through a Unix socket."""
        url = sa.make_url(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        if url.host is None or url.host.startswith("/") or "unix_socket" in url.query:
            return None
        return url.port or {"postgresql": 5432, "mysql": 3306}.get(url.get_backend_name())

    def _settings(self, url: str) -> dict[str, str]:
        """The settings every component gets."""
        tasks = self.sizes.tasks_per_burst
        settings = {
            **processes.airflow_settings(self.home, url),
            **self._database(url),
            "AIRFLOW__CORE__EXECUTOR": EXECUTORS[self.shape.executor],
            # Every producer task of a burst runs at once (plus nothing else: the
            # consumers' EmptyOperator never reaches the executor).
            "AIRFLOW__CORE__PARALLELISM": str(max(tasks, 4)),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(max(tasks, 16)),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__ASSET_MANAGER_CLASS": MANAGER_CLASSES[self.manager],
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
        if self.manager_kwargs is not None:
            settings["AIRFLOW__CORE__ASSET_MANAGER_KWARGS"] = self.manager_kwargs
        if self.shape.reparse_s:
            settings["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] = str(self.shape.reparse_s)
        if self.broker_url is not None:
            settings["AIRFLOW__CELERY__BROKER_URL"] = self.broker_url
            # The tasks' queue and the one the workers consume (a stale message of another
            # deployment on the same broker database never reaches these workers).
            settings["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] = f"adrq-live-{self.id[:12]}"
            # Every producer task of a burst runs at once, as with LocalExecutor.
            concurrency = math.ceil(tasks / self.shape.celery_workers)
            settings["AIRFLOW__CELERY__WORKER_CONCURRENCY"] = str(concurrency)
        if self.shape.pgbouncer:
            # asyncpg's numbered prepared statements clash behind transaction pooling.
            connect_args = "airflow_adrq_testing.servers.ASYNCPG_CONNECT_ARGS"
            settings["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = connect_args
        if self.target.backend == "mysql":
            # 3.3.2's scheduler exits on MariaDB at its first orphan clean-up (60 s):
            # _update_asset_orphanage sends WITH ... DELETE ... RETURNING (error 1064).
            settings["AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL"] = "86400"
        return settings

    def _database(self, url: str) -> dict[str, str]:
        """The settings that name the database: Airflow's, and Celery's result backend there."""
        settings = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
        if self.shape.celery:
            # With the driver named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3.
            settings["AIRFLOW__CELERY__RESULT_BACKEND"] = f"db+{url}"
        return settings

    def migrate(self, timeout: float) -> None:
        """``airflow db migrate``: Airflow's own schema on the scratch database, as an operator makes it
        (directly: its advisory lock is session state, which PgBouncer's transaction pooling loses)."""
        log = self.log_of("db-migrate")
        processes.wait_migrate(processes.start_migrate(self.env, log), log, timeout)

    def start(self) -> None:
        """Start the PgBouncer (with one), the api-server, the scheduler(s), the DAG processor and the
        Celery workers (with CeleryExecutor), in that order."""
        if self.shape.pgbouncer:
            try:
                bouncer = self._pgbouncer.enter_context(servers.pgbouncer(self.target.server_url))
            except servers.ServerNotFoundError as exc:
                raise LiveError(f"PgBouncer: {exc}") from None
            at = sa.make_url(bouncer)
            pooled = sa.make_url(self.url).set(host=at.host, port=at.port)
            self.env.update(self._database(pooled.render_as_string(hide_password=False)))
        self._start("api-server", "api-server", "--host", "127.0.0.1", "--port", str(self.port))
        for index in range(self.schedulers):
            self._start(f"scheduler-{index + 1}", "scheduler", "--skip-serve-logs")
        self._start("dag-processor", "dag-processor")
        for index in range(self.shape.celery_workers if self.shape.celery else 0):
            hostname = f"w{index + 1}@{self.id}"
            self._start(f"celery-worker-{index + 1}", "celery", "worker", "--skip-serve-logs", "-H", hostname)

    def _start(self, name: str, *args: str) -> None:
        self.components[name] = processes.airflow(args, self.env, self.log_of(name), cwd=self.home)

    def log_of(self, name: str) -> Path:
        """The log file of component ``name`` (``api-server``, ``scheduler-1``, ``dag-processor`` ...)."""
        return self.log_dir / f"{name}.log"

    def check_alive(self) -> None:
        """Raise :class:`LiveError` naming the component and its log if one has exited."""
        for name, process in self.components.items():
            if process.poll() is not None:
                log = self.log_of(name)
                tail = log.read_text(errors="replace")[-1500:]
                raise LiveError(f"{name} exited with status {process.returncode} ({log}):\n{tail}")

    def stop(self) -> list[str]:
        """Stop everything this deployment started (once); returns what needed SIGKILL.

        SIGTERM to each component's process group in :data:`_STOP_ORDER`; after the grace period SIGKILL
        to every process still carrying the deployment's :data:`MARKER` (the task SDK moves each task
        into a group of its own); the PgBouncer last.
        """
        names = sorted(self.components, key=lambda n: [n.startswith(p) for p in _STOP_ORDER].index(True))
        order = [(name, self.components.pop(name)) for name in names]
        for _, process in order:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30.0  # the grace period: 30 s between SIGTERM and SIGKILL
        for _, process in order:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        killed = [name for name, process in order if process.poll() is None]
        left = []
        for stray in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if stray.pid != os.getpid() and stray.environ().get(MARKER) == self.id:
                    stray.kill()
                    left.append(stray)
        psutil.wait_procs(left, timeout=10)
        for _, process in order:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        if len(left) > len(killed):
            killed.append(f"{len(left) - len(killed)} other process(es) by pid")
        self._pgbouncer.close()
        return killed


# The live run's two DAG files (``airflow.sdk`` and the standard provider only; their settings a JSON
# literal at the top), so that a producer task process, which parses its own DAG's file, does not
# parse the consumers. Producers: ``producer_dags`` DAGs of one task mapped over ``instances``, whose
# instances meet at a file-system barrier and finish within ``spread_s`` of each other, so that the
# burst's task-success calls (the asset events and queue rows) reach the api-server together; and
# the warm-up DAG. Consumers: ``consumers`` DAGs, each one ``EmptyOperator`` (the scheduler completes
# it without the executor) on ``a0 | a1 | ...`` (with ``own_assets`` half of them on ``a0 & a1 & ...``).
PRODUCERS_FILE: Final = "adrq_live_producers.py"
CONSUMERS_FILE: Final = "adrq_live_consumers.py"

_HEADER = '''\
"""{title}

Written by `airflow-adrq bench --airflow --live` into its scratch deployment, on every run."""

from __future__ import annotations

import datetime
import json

SETTINGS = json.loads({settings!r})
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
DAG_ARGS = {{"start_date": START, "catchup": False, "tags": ["adrq-live"]}}
'''

_PRODUCERS = '''
import os
import random
import time
from pathlib import Path

from airflow.sdk import DAG, Asset, get_current_context, task

for dag_id, names in SETTINGS["outlets"].items():
    with DAG(dag_id=dag_id, schedule=None, max_active_tasks=SETTINGS["instances"], **DAG_ARGS):

        @task(
            outlets=[Asset(name) for name in names],
            retries=SETTINGS["retries"],
            retry_delay=datetime.timedelta(seconds=2),
        )
        def produce(i: int) -> None:
            """Leave a file in the burst's barrier folder; once every instance of the burst left one, sleep
            until the last one's arrival plus lead_s (the same moment for all), plus 0..spread_s, and succeed
            (the success call emits the outlets). After barrier_timeout_s, go alone (a retry finds them all
            there and goes at once)."""
            context = get_current_context()
            burst = context["dag_run"].conf.get("burst", context["run_id"])
            folder = Path(SETTINGS["barrier_dir"]) / str(burst)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{context['ti'].dag_id}.{context['ti'].map_index}").touch()
            give_up = time.monotonic() + SETTINGS["barrier_timeout_s"]
            # Count the names (one directory read) every 0.1 s (well inside lead_s), and stat them only
            # once all are there: with 128 instances waiting, a stat of every file every 20 ms kept
            # 2 cores busy and starved the api-server while the rest of the burst was starting.
            while len(os.listdir(folder)) < SETTINGS["expected"]:
                if time.monotonic() > give_up:
                    return
                time.sleep(0.1)
            arrived = [f.stat().st_mtime for f in folder.iterdir()]
            finish = max(arrived) + SETTINGS["lead_s"] + random.uniform(0.0, SETTINGS["spread_s"])
            time.sleep(max(0.0, finish - time.time()))

        produce.expand(i=list(range(SETTINGS["instances"])))

with DAG(dag_id=SETTINGS["warm_dag"], schedule=None, **DAG_ARGS):

    @task(outlets=[Asset(SETTINGS["warm_asset"])])
    def warm(i: int) -> None:
        """Nothing: the run exists to send every execution-API call once before the bursts."""

    warm.expand(i=list(range(SETTINGS["expected"])))
'''

_CONSUMERS = """
import functools
import operator

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset

# Asset("a0") | Asset("a1") | ...: one event of any of them queues every consumer;
# the DAGs in SETTINGS["all_of"] run on Asset("a0") & Asset("a1") & ...: one event of each.
ASSETS = [Asset(name) for name in SETTINGS["assets"]]
ANY_OF = functools.reduce(operator.or_, ASSETS)
ALL_OF = functools.reduce(operator.and_, ASSETS)

for dag_id in SETTINGS["dag_ids"]:
    with DAG(dag_id=dag_id, schedule=ALL_OF if dag_id in SETTINGS["all_of"] else ANY_OF, **DAG_ARGS):
        EmptyOperator(task_id="done")
"""


def write_dag_files(dags_folder: Path, barrier_dir: Path, sizes: LiveSizes) -> list[Path]:
    """Write the two DAG files for ``sizes`` into ``dags_folder``; returns their paths."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    producers = {
        "outlets": {d: sizes.outlets_of(p) for p, d in enumerate(sizes.producer_ids)},
        "instances": sizes.instances,
        "expected": sizes.tasks_per_burst,
        "retries": sizes.retries,
        "barrier_dir": str(barrier_dir),
        "barrier_timeout_s": sizes.barrier_s,
        "lead_s": sizes.lead_s,
        "spread_s": sizes.spread_s,
        "warm_dag": WARM_DAG,
        "warm_asset": "adrq_live_warm",
    }
    consumers = {"dag_ids": sizes.consumer_ids, "assets": sizes.assets, "all_of": sizes.all_of_ids}
    files = {
        PRODUCERS_FILE: ("Producer DAGs, one mapped task each, and the warm-up DAG.", producers, _PRODUCERS),
        CONSUMERS_FILE: ("Consumer DAGs, each one EmptyOperator.", consumers, _CONSUMERS),
    }
    for name, (title, settings, body) in files.items():
        header = _HEADER.format(title=title, settings=json.dumps(settings, sort_keys=True))
        (dags_folder / name).write_text(header + body)
    return [dags_folder / name for name in files]
