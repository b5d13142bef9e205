"""``airflow-adrq bench --airflow --accounting``: asset events that no run consumes, through Airflow itself.

::

    airflow-adrq bench --airflow --accounting                # SQLite + every PostgreSQL/MariaDB server found
    airflow-adrq bench --airflow --accounting --quick        # smaller rounds
    airflow-adrq bench --airflow --accounting --db postgresql://root@127.0.0.1/postgres

The library benchmark's lost-events table (``airflow-adrq bench``, scenario
``lost_events``) applies a copy of Airflow 3.3.2's scheduler rule. This mode
measures the same thing with Airflow's own code on both sides:

* **producers**: the Airflow mode's worker processes (:mod:`.worker`), each
  bound to one asset manager through ``[core] asset_manager_class`` (``stock``:
  Airflow's ``AssetManager``; ``plugin``: ``airflow_adrq.airflow.AdrqAssetManager``),
  run task-success transactions through ``TaskInstance.register_asset_changes_in_db``
  with one outlet, hold them open ``hold`` ms (the rest of task success), and
  COMMIT;
* **consumer**: one more Airflow process running the scheduler's own
  ``SchedulerJobRunner._create_dagruns_for_dags`` (``DagModel.dags_needing_dagruns``,
  then ``_create_dag_runs_asset_triggered``, then its guarded COMMIT), pass
  after pass (1 ms apart) while the producers run, on a ``SchedulerJobRunner``
  with a ``Job`` row whose loop is never started. Runs are created QUEUED and
  nothing executes. The consumer DAGs are real serialized DAGs
  (``airflow.sdk.DAG(schedule=[Asset(...)])`` written by Airflow's
  ``update_dag_parsing_results_in_db``: ``dag``, ``serialized_dag``,
  ``dag_version``, ``asset_expression``, schedule references).

Per database, hold and manager (a *cell*, with an asset and consumer DAGs
of its own), after a warm-up transaction per producer on another asset:

1. the consumer starts passing; every producer of the manager starts at a
   barrier and commits ``transactions`` transactions (a deadlock or other
   retryable error replays the transaction, as in the Airflow mode);
2. once they are done the consumer stops and *drains*: passes until none of
   the cell's queue rows is left, so every committed queue row became a run;
3. a *sentinel* event of the asset is committed by one producer of the same
   manager, and the consumer drains again. An event whose queue row already
   existed waits for the next run of its DAG (Airflow keeps the row's
   ``created_at``): it is *late*, not lost; the sentinel's runs pick such
   events up. Only what even they leave out was consumed by no run, ever.

Each pair (event, consumer DAG) is then *consumed* (by a run created before
the sentinel), *late* (only by the sentinel's runs) or *unconsumed* (in no
run's ``consumed_asset_events``, the ``dagrun_asset_event`` table); an event
takes the worst of its pairs. Checks (exit status 1 when one fails): the
events in the database are exactly the committed transactions; every event is
in exactly one class; no run of the cell's DAGs consumed an event of another
asset; every consumer DAG consumed the sentinel; no queue row is left; and the
plug-in leaves no more events unconsumed than stock at the same hold.

The controller never imports Airflow: the producers are :mod:`.worker`
processes (started and driven as in :mod:`.run`) and the consumer is a
process of this module (:func:`consumer_main`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.util
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import servers
from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.worker import asset_uri, serve
from airflow_adrq_bench.errors import BenchError

__all__ = [
    "DEFAULT",
    "MANAGERS",
    "QUICK",
    "AccountingSizes",
    "PairClasses",
    "build_parser",
    "classify",
    "compare",
    "consumer_main",
    "format_tables",
    "main",
    "run",
]

#: The managers compared, in report order (see :data:`.config.MANAGER_CLASSES`).
MANAGERS: Final = ("stock", "plugin")

#: The DAG bundle of the serialized DAGs this mode writes.
BUNDLE: Final = "adrq-accounting-bundle"
#: The producing DAG (the task-instance stand-ins of :mod:`.worker` name it).
PRODUCER_DAG: Final = "adrq_bench_producer"
WARM_ASSET: Final = "adrq_acct_warm"

_BACKENDS = ("sqlite", *servers.BACKENDS)
_START_TIMEOUT = 600.0


@dataclass(frozen=True)
class AccountingSizes:
    """How big an accounting run is (per database: ``len(holds_ms) * 2`` cells)."""

    #: Producer processes per manager.
    producers: int = 6
    #: Transactions (one event each) per producer and cell.
    transactions: int = 40
    #: Consumer DAGs scheduled on each cell's asset.
    consumers: int = 3
    #: Holds before COMMIT compared, in milliseconds.
    holds_ms: tuple[float, ...] = (5.0, 30.0)
    #: A producer starts no new attempt after this many seconds of a cell.
    budget_s: float = 60.0
    #: The consumer's pause between passes while the producers run.
    consumer_pause_ms: float = 1.0

    def __post_init__(self) -> None:
        if min(self.producers, self.transactions, self.consumers) < 1:
            raise ValueError("producers, transactions and consumers must be at least 1")
        if not self.holds_ms or any(h < 0 for h in self.holds_ms):
            raise ValueError("holds_ms must name at least one hold, none negative")
        if self.budget_s <= 0 or self.consumer_pause_ms < 0:
            raise ValueError("budget_s must be > 0 and consumer_pause_ms >= 0")


DEFAULT: Final = AccountingSizes()
QUICK: Final = AccountingSizes(producers=4, transactions=15, budget_s=30.0)

_SIZE_HELP: Final = {
    "producers": "producer processes per manager",
    "transactions": "transactions (one event each) per producer and cell",
    "consumers": "consumer DAGs of each cell's asset",
    "holds_ms": "holds before COMMIT, comma-separated milliseconds",
    "budget_s": "seconds after a cell's start when producers stop starting transactions",
    "consumer_pause_ms": "the consumer's pause between scheduler passes",
}


class AccountingError(BenchError):
    """The accounting run could not run."""


# --- classification (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class PairClasses:
    """Every (event, consumer DAG) pair and every event of a cell, each in exactly one class."""

    pairs: int
    consumed_pairs: int
    late_pairs: int
    unconsumed_pairs: int
    #: Pairs consumed by more than one run of the DAG (counted once above).
    duplicate_pairs: int
    events: int
    #: Every pair consumed before the sentinel.
    consumed: int
    #: No pair unconsumed, at least one only by the sentinel's runs.
    late: int
    #: At least one consumer DAG's runs never consumed it.
    unconsumed: int
    #: Consumed by no run of any consumer DAG.
    in_no_run: int
    #: Consumed pairs of the cell's DAGs whose event is neither the cell's nor the sentinel.
    unknown: int
    #: Consumer DAGs that consumed the sentinel.
    sentinel_consumers: int

    @property
    def classes_add_up(self) -> bool:
        return (
            self.consumed_pairs + self.late_pairs + self.unconsumed_pairs == self.pairs
            and self.consumed + self.late + self.unconsumed == self.events
        )


def classify(
    events: Iterable[int],
    dags: Sequence[str],
    consumed: Iterable[tuple[int, str, int]],
    cutoff: int,
    sentinel: int | None,
) -> PairClasses:
    """Classify ``events`` x ``dags`` from ``consumed`` rows ``(dag_run id, dag_id, event id)``.

    Runs with ``id <= cutoff`` were created before the sentinel; the others
    after it. A pair is *consumed* if a run before the sentinel consumed it,
    *late* if only later runs did, *unconsumed* if none did.
    """
    event_ids = sorted(set(events))
    known = set(event_ids)
    dag_set = set(dags)
    runs_of: dict[tuple[int, str], set[int]] = defaultdict(set)
    sentinel_dags: set[str] = set()
    unknown = 0
    for run_id, dag_id, event_id in consumed:
        if dag_id not in dag_set:
            continue
        if event_id in known:
            runs_of[(event_id, dag_id)].add(run_id)
        elif sentinel is not None and event_id == sentinel:
            sentinel_dags.add(dag_id)
        else:
            unknown += 1
    pair_class: dict[tuple[int, str], str] = {}
    for event_id in event_ids:
        for dag_id in dags:
            runs = runs_of.get((event_id, dag_id), set())
            if not runs:
                pair_class[(event_id, dag_id)] = "unconsumed"
            elif min(runs) <= cutoff:
                pair_class[(event_id, dag_id)] = "consumed"
            else:
                pair_class[(event_id, dag_id)] = "late"
    pair_counts = Counter(pair_class.values())
    event_counts: Counter[str] = Counter()
    in_no_run = 0
    for event_id in event_ids:
        classes = {pair_class[(event_id, d)] for d in dags}
        worst = next(c for c in ("unconsumed", "late", "consumed") if c in classes)
        event_counts[worst] += 1
        if classes == {"unconsumed"}:
            in_no_run += 1
    return PairClasses(
        pairs=len(pair_class),
        consumed_pairs=pair_counts["consumed"],
        late_pairs=pair_counts["late"],
        unconsumed_pairs=pair_counts["unconsumed"],
        duplicate_pairs=sum(1 for runs in runs_of.values() if len(runs) > 1),
        events=len(event_ids),
        consumed=event_counts["consumed"],
        late=event_counts["late"],
        unconsumed=event_counts["unconsumed"],
        in_no_run=in_no_run,
        unknown=unknown,
        sentinel_consumers=len(sentinel_dags),
    )


# --- the consumer process (imports Airflow) ---------------------------------------------


_QUEUED = sa.text("SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id IN :dags")


class _Consumer:
    """Airflow's scheduler method on a ``SchedulerJobRunner`` whose loop never runs."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.session_factory: Any = None
        self.runner: Any = None
        self.engine: Any = None
        #: Database errors the consumer's connections raised, including those
        #: ``@retry_db_transaction`` retried inside a pass (never seen otherwise).
        self.db_errors: Counter[str] = Counter()

    def target(self, url: str) -> dict[str, Any]:
        """Point Airflow's ORM at ``url`` (as :mod:`.worker` does); a new ``Job`` and runner there."""
        from airflow import settings
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

        self.release()
        os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url
        settings.configure_vars()
        settings.reconfigure_orm()
        self.engine = settings.engine
        self.session_factory = settings.NonScopedSession
        sa.event.listen(self.engine, "handle_error", self._count_error)
        job = Job()
        self.runner = SchedulerJobRunner(job=job)
        with self.session_factory() as session:
            session.add(job)
            session.commit()
            job_id = job.id
        return {"dialect": self.engine.dialect.name, "job_id": job_id}

    def _count_error(self, context: Any) -> None:
        from airflow_adrq.retry import classify as classify_error

        found = classify_error(context.sqlalchemy_exception or context.original_exception)
        self.db_errors[found.kind.value if found else type(context.original_exception).__name__] += 1

    def release(self) -> None:
        if self.engine is not None:
            from airflow import settings

            settings.dispose_orm(do_log=False)
            self.engine = None
            self.session_factory = None
            self.runner = None

    def seed(self, assets: dict[str, list[str]]) -> dict[str, int]:
        """Serialize and write the DAGs with Airflow's DAG-processing code; return the asset ids.

        ``assets[name]`` are the consumer DAG ids of asset ``name`` (URI
        :func:`.worker.asset_uri`, as the producers' outlets name it). The
        DAGs are unpaused; ``max_active_runs`` is high, since the runs stay
        QUEUED. Plus :data:`PRODUCER_DAG`, unscheduled.
        """
        from airflow.dag_processing.collection import update_dag_parsing_results_in_db
        from airflow.models.asset import AssetActive, AssetModel
        from airflow.models.dag import DagModel
        from airflow.models.dagbundle import DagBundleModel
        from airflow.sdk import DAG, Asset
        from airflow.serialization.serialized_objects import LazyDeserializedDAG

        dags = [DAG(PRODUCER_DAG, schedule=None)]
        for name, dag_ids in assets.items():
            asset = Asset(name=name, uri=asset_uri(name))
            dags += [DAG(dag_id, schedule=[asset], max_active_runs=1_000_000) for dag_id in dag_ids]
        with self.session_factory() as session:
            session.add(DagBundleModel(name=BUNDLE))
            session.commit()
            update_dag_parsing_results_in_db(
                BUNDLE,
                None,
                [LazyDeserializedDAG.from_dag(dag) for dag in dags],
                {},
                None,
                set(),
                session=session,
            )
            session.commit()
            session.execute(
                sa.update(DagModel)
                .where(DagModel.dag_id.in_([d.dag_id for d in dags]))
                .values(is_paused=False)
            )
            ids: dict[str, int] = {}
            for model in session.scalars(sa.select(AssetModel).where(AssetModel.name.in_(list(assets)))):
                ids[model.name] = model.id
                if model.active is None:
                    session.add(AssetActive.for_asset(model))
            session.commit()
            missing = set(assets) - set(ids)
            if missing:
                raise RuntimeError(f"assets not written by the DAG sync: {sorted(missing)}")
            expressions = dict(
                session.execute(
                    sa.select(DagModel.dag_id, DagModel.asset_expression).where(
                        DagModel.dag_id.in_([d for ids_ in assets.values() for d in ids_])
                    )
                ).all()
            )
            if any(expr is None for expr in expressions.values()):
                raise RuntimeError("a consumer DAG has no asset_expression after serialization")
        return ids

    def scheduler_pass(self, failures: Counter[str]) -> float:
        """One ``_create_dagruns_for_dags`` under ``prohibit_commit``, as the scheduler loop calls it."""
        from airflow.utils.sqlalchemy import prohibit_commit

        from airflow_adrq.retry import classify as classify_error

        start = time.perf_counter()
        session = self.session_factory()
        try:
            with prohibit_commit(session) as guard:
                self.runner._create_dagruns_for_dags(guard, session)
        except Exception as exc:
            # Its own @retry_db_transaction gave up: the next pass tries again.
            found = classify_error(exc)
            if found is None:
                raise
            session.rollback()
            failures[found.kind.value] += 1
        finally:
            session.close()
        return time.perf_counter() - start

    def _queued(self, dag_ids: list[str]) -> int:
        with self.session_factory() as session:
            return int(
                session.execute(
                    _QUEUED.bindparams(sa.bindparam("dags", expanding=True)),
                    {"dags": dag_ids},
                ).scalar_one()
            )

    def drain(self, dag_ids: list[str], max_passes: int = 500) -> dict[str, Any]:
        """Pass until none of ``dag_ids``' queue rows is left (every committed row became a run)."""
        failures: Counter[str] = Counter()
        passes = 0
        while self._queued(dag_ids) and passes < max_passes:
            self.scheduler_pass(failures)
            passes += 1
        return {"passes": passes, "failures": dict(failures), "queue_rows_left": self._queued(dag_ids)}

    def consume(self, dag_ids: list[str], pause_s: float) -> dict[str, Any]:
        """Pass continuously until the controller sends ``stop``, then drain.

        Sends ``("ok", "started")`` after the first pass, so that the
        producers start with the consumer already running.
        """
        failures: Counter[str] = Counter()
        self.db_errors.clear()
        pass_s: list[float] = []
        pass_s.append(self.scheduler_pass(failures))
        self.conn.send(("ok", "started"))
        while True:
            if self.conn.poll():
                message = self.conn.recv()
                if message[0] != "stop":
                    raise RuntimeError(f"expected stop, got {message[0]!r}")
                break
            pass_s.append(self.scheduler_pass(failures))
            if pause_s:
                time.sleep(pause_s)
        drained = self.drain(dag_ids)
        ms = sorted(s * 1000 for s in pass_s)
        return {
            "passes": len(pass_s),
            "pass_p50_ms": statistics.median(ms),
            "pass_max_ms": ms[-1],
            "failures": dict(failures),
            "db_errors": dict(self.db_errors),
            "drain": drained,
        }


def _apply_environment(env: dict[str, str]) -> None:
    for name in [n for n in os.environ if n.startswith("AIRFLOW_")]:
        del os.environ[name]
    os.environ.update(env)


def consumer_main(conn: Any, env: dict[str, str]) -> None:
    """Consumer process: import Airflow (its default asset manager), then serve commands until ``close``."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops it
    _apply_environment(env)
    try:
        import airflow
        import airflow.jobs.scheduler_job_runner  # the slow import, done once here
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    consumer = _Consumer(conn)
    conn.send(("ok", {"pid": os.getpid(), "airflow": str(airflow.__version__)}))
    commands: dict[str, Callable[..., Any]] = {
        "target": consumer.target,
        "release": consumer.release,
        "seed": consumer.seed,
        "drain": consumer.drain,
        "consume": consumer.consume,
    }
    serve(conn, commands, close=consumer.release)


class _ConsumerProcess:
    """The controller's handle on the consumer process."""

    def __init__(self, env: dict[str, str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=consumer_main, args=(child, env), name="adrq-accounting-consumer")
        self.process.start()
        child.close()
        self.info: dict[str, Any] = {}
        self.closed = False

    def started(self) -> dict[str, Any]:
        if not self.info:
            self.info = self.receive(_START_TIMEOUT)
        return self.info

    def send(self, name: str, **kwargs: Any) -> None:
        self.conn.send((name, kwargs))

    def receive(self, timeout: float = 600) -> Any:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise AccountingError("the consumer process is gone; its output is above")
            if time.monotonic() > deadline:
                raise AccountingError(f"the consumer did not answer within {timeout:g} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise AccountingError("the consumer process exited; its output is above") from None
        if status != "ok":
            raise AccountingError(f"the consumer failed:\n{value}")
        return value

    def call(self, name: str, timeout: float = 600, **kwargs: Any) -> Any:
        self.send(name, **kwargs)
        return self.receive(timeout)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.conn.send(("close", {}))
            self.conn.poll(30)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        with contextlib.suppress(Exception):
            self.conn.close()


# --- the controller ------------------------------------------------------------------


def _cell_asset(hold_index: int, manager: str) -> str:
    return f"adrq_acct_h{hold_index}_{manager}"


def _consumer_dags(asset: str, consumers: int) -> list[str]:
    return [f"{asset}_c{k}" for k in range(consumers)]


def _start_migrate(url: str, home: Path) -> subprocess.Popen[str]:
    """``airflow db migrate`` on ``url`` in the background (as :func:`.run` runs it, but not waited for)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW_")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        }
    )
    return subprocess.Popen(
        [*run_module._airflow_command(), "db", "migrate"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_migrate(proc: subprocess.Popen[str], target: run_module.Target) -> None:
    try:
        output, _ = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AccountingError(f"{target.version}: airflow db migrate took more than 900 s") from None
    if proc.returncode != 0:
        raise AccountingError(
            f"{target.version}: airflow db migrate failed (exit {proc.returncode}):\n{output[-3000:]}"
        )


def _fetch_consumed(engine: sa.Engine, dags: Sequence[str]) -> list[tuple[int, str, int]]:
    stmt = sa.text(
        "SELECT r.id, r.dag_id, e.event_id FROM dag_run r "
        "JOIN dagrun_asset_event e ON e.dag_run_id = r.id WHERE r.dag_id IN :dags"
    ).bindparams(sa.bindparam("dags", expanding=True))
    with engine.connect() as conn:
        return [(int(r[0]), str(r[1]), int(r[2])) for r in conn.execute(stmt, {"dags": list(dags)})]


def _runs(engine: sa.Engine, dags: Sequence[str]) -> list[tuple[int, str]]:
    stmt = sa.text("SELECT id, run_type FROM dag_run WHERE dag_id IN :dags").bindparams(
        sa.bindparam("dags", expanding=True)
    )
    with engine.connect() as conn:
        return [(int(r[0]), str(r[1])) for r in conn.execute(stmt, {"dags": list(dags)})]


def _max_run_id(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM dag_run")).scalar_one())


def _latest_deadlock(engine: sa.Engine) -> str | None:
    """MySQL/MariaDB: InnoDB's LATEST DETECTED DEADLOCK section (who waited for what), if any."""
    if engine.dialect.name != "mysql":
        return None
    try:
        with engine.connect() as conn:
            status = str(conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").fetchone()[2])  # type: ignore[index]
    except sa.exc.DBAPIError:
        return None  # needs the PROCESS privilege
    start = status.find("LATEST DETECTED DEADLOCK")
    if start < 0:
        return None
    end = status.find("\nTRANSACTIONS\n", start)
    return status[start : end if end > 0 else start + 6000][:6000]


def _asset_events(engine: sa.Engine, asset_id: int) -> list[tuple[int, str]]:
    stmt = sa.text("SELECT id, source_run_id FROM asset_event WHERE asset_id = :a")
    with engine.connect() as conn:
        return [(int(r[0]), str(r[1])) for r in conn.execute(stmt, {"a": asset_id})]


@dataclass
class _Plan:
    sizes: AccountingSizes
    managers: Sequence[str]

    def assets(self) -> dict[str, list[str]]:
        out = {WARM_ASSET: _consumer_dags(WARM_ASSET, self.sizes.consumers)}
        for h in range(len(self.sizes.holds_ms)):
            for manager in self.managers:
                asset = _cell_asset(h, manager)
                out[asset] = _consumer_dags(asset, self.sizes.consumers)
        return out


def run(
    targets: Sequence[run_module.Target],
    sizes: AccountingSizes,
    *,
    managers: Sequence[str] = MANAGERS,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Run every cell on every target; returns the raw results (``cells``, ``problems`` ...)."""
    started = time.monotonic()
    raw: dict[str, Any] = {
        "tool": "airflow-adrq bench --airflow --accounting",
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": {"start": list(os.getloadavg())},
        "sizes": dataclasses.asdict(sizes),
        "managers": list(managers),
        "targets": [],
        "cells": [],
        "problems": [],
    }
    plan = _Plan(sizes, list(managers))
    workdir = Path(tempfile.mkdtemp(prefix="adrq-airflow-accounting-"))
    base_env = {
        "AIRFLOW_HOME": str(workdir),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{workdir}/unused.db",
    }
    try:
        with contextlib.ExitStack() as stack:
            # Scratch databases first (dropped last), migrated in the background
            # while the Airflow processes import Airflow.
            urls: list[str] = []
            migrations: list[subprocess.Popen[str]] = []
            for target in targets:
                url = stack.enter_context(run_module._scratch_database(target, workdir))
                urls.append(url)
                migrations.append(_start_migrate(url, workdir))
                stack.callback(_kill, migrations[-1])
            progress(
                f"airflow db migrate on {len(targets)} scratch database(s); starting the consumer and "
                f"{len(managers)} x {sizes.producers} producer processes (each imports Airflow)"
            )
            consumer = _ConsumerProcess(base_env)
            stack.callback(consumer.close)
            workers = run_module._Workers(list(managers), sizes.producers, workdir)
            stack.callback(workers.close)
            raw["workers"] = [p.info for p in workers.procs.values()]
            raw["consumer"] = consumer.started()
            raw["airflow_version"] = raw["consumer"]["airflow"]
            for target, url, migration in zip(targets, urls, migrations, strict=True):
                _wait_migrate(migration, target)
                raw["targets"].append(_run_target(target, url, plan, workers, consumer, raw, progress))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    raw["comparison"] = compare(raw["cells"])
    raw["problems"] += [c["problem"] for c in raw["comparison"] if c.get("problem")]
    raw["duration_s"] = time.monotonic() - started
    raw["load_average"]["end"] = list(os.getloadavg())
    return raw


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _run_target(
    target: run_module.Target,
    url: str,
    plan: _Plan,
    workers: Any,
    consumer: _ConsumerProcess,
    raw: dict[str, Any],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    began = time.monotonic()
    sizes = plan.sizes
    all_procs = list(workers.procs.values())
    engine = run_module._control_engine(url)
    try:
        workers.broadcast(all_procs, "target", url=url)
        info = consumer.call("target", url=url)
        asset_ids: dict[str, int] = consumer.call("seed", assets=plan.assets())
        run_module._analyze(engine)
        settings = run_module._server_settings(engine)
        progress(f"{target.version}: warming up every producer (one transaction each)")
        for proc in all_procs:
            result = workers.call(
                proc, "warmup", assets=[WARM_ASSET], run_id=f"warmup-{proc.manager}-{proc.index}"
            )
            if not result["ok"]:
                raise AccountingError(f"{target.version}: warm-up of {proc.manager}/{proc.index} failed")
        run_module._clear_queue(engine)
        for h, hold_ms in enumerate(sizes.holds_ms):
            for manager in run_module._rotate(plan.managers, h):
                progress(f"{target.version}: hold {hold_ms:g} ms: {manager}")
                cell = _cell(target, engine, plan, workers, consumer, asset_ids, h, hold_ms, manager)
                raw["cells"].append(cell)
                where = f"{target.name} hold {hold_ms:g} ms {manager}"
                raw["problems"] += [f"{where}: {p}" for p in cell["problems"]]
        workers.broadcast(all_procs, "release")
        consumer.call("release")
    except BaseException:
        # Stop the processes before the scratch database is dropped (their
        # open transactions would hold DROP DATABASE up on MySQL).
        workers.close()
        consumer.close()
        raise
    finally:
        engine.dispose()
    return {
        "name": target.name,
        "backend": target.backend,
        "version": target.version,
        "dialect": info["dialect"],
        "settings": settings,
        "duration_s": time.monotonic() - began,
    }


def _cell(
    target: run_module.Target,
    engine: sa.Engine,
    plan: _Plan,
    workers: Any,
    consumer: _ConsumerProcess,
    asset_ids: dict[str, int],
    hold_index: int,
    hold_ms: float,
    manager: str,
) -> dict[str, Any]:
    sizes = plan.sizes
    asset = _cell_asset(hold_index, manager)
    dags = _consumer_dags(asset, sizes.consumers)
    prefix = f"acct-{manager}-h{hold_index}-"
    sentinel_run = f"sentinel-{manager}-h{hold_index}"
    producers = workers.group(manager)
    start = time.monotonic()
    consumer.send("consume", dag_ids=dags, pause_s=sizes.consumer_pause_ms / 1000)
    try:
        consumer.receive()  # "started": its first pass is done
        results = workers.broadcast(
            producers,
            "round",
            timeout=sizes.budget_s + 600,
            assets=[asset],
            run_prefix=prefix,
            transactions=sizes.transactions,
            hold_s=hold_ms / 1000,
            budget_s=sizes.budget_s,
            barrier_timeout_s=120.0,
        )
    finally:
        consumer.send("stop")
    consumed_run = consumer.receive()
    duration = time.monotonic() - start
    cutoff = _max_run_id(engine)
    sentinel = workers.call(producers[0], "warmup", assets=[asset], run_id=sentinel_run)
    drained = consumer.call("drain", dag_ids=dags)

    txs = [tx for r in results for tx in r["transactions"]]
    committed = sum(1 for tx in txs if tx["ok"])
    not_started = sum(1 for tx in txs if not tx["ok"] and tx["attempts"] == 0)
    producer_failures: Counter[str] = Counter()
    for tx in txs:
        producer_failures.update(tx["failures"])
    rows = _asset_events(engine, asset_ids[asset])
    events = [e for e, run_id in rows if run_id.startswith(prefix)]
    sentinels = [e for e, run_id in rows if run_id == sentinel_run]
    strays = [e for e, run_id in rows if not run_id.startswith(prefix) and run_id != sentinel_run]
    sentinel_id = sentinels[0] if len(sentinels) == 1 else None
    classes = classify(events, dags, _fetch_consumed(engine, dags), cutoff, sentinel_id)
    runs = _runs(engine, dags)

    problems = []
    if len(events) != committed:
        problems.append(f"{len(events)} events in the database, {committed} committed transactions")
    if strays:
        problems.append(f"{len(strays)} events of the cell's asset from neither the round nor the sentinel")
    if not classes.classes_add_up or classes.pairs != committed * len(dags):
        problems.append(
            f"classes do not add up: {classes.consumed} + {classes.late} + {classes.unconsumed} events "
            f"of {classes.events}; {classes.pairs} pairs for {committed} committed x {len(dags)} DAGs"
        )
    if classes.unknown:
        problems.append(f"runs of the cell's DAGs consumed {classes.unknown} pairs of unknown events")
    if not sentinel["ok"] or sentinel_id is None:
        problems.append(f"the sentinel was not committed exactly once ({len(sentinels)} events)")
    elif classes.sentinel_consumers != len(dags):
        problems.append(f"{classes.sentinel_consumers} of {len(dags)} consumer DAGs consumed the sentinel")
    left = consumed_run["drain"]["queue_rows_left"] + drained["queue_rows_left"]
    if left:
        problems.append(f"{left} queue rows left after the drains")
    bad_types = [t for _, t in runs if t != "asset_triggered"]
    if bad_types:
        problems.append(f"{len(bad_types)} runs not asset-triggered: {sorted(set(bad_types))}")
    return {
        "db": target.name,
        "version": target.version,
        "manager": manager,
        "hold_ms": hold_ms,
        "producers": len(producers),
        "planned": len(txs),
        "committed": committed,
        "gave_up": len(txs) - committed - not_started,
        "not_started": not_started,
        "producer_failures": dict(producer_failures),
        "consumers": len(dags),
        **dataclasses.asdict(classes),
        "runs": len(runs),
        "runs_before_sentinel": sum(1 for r, _ in runs if r <= cutoff),
        "duration_s": duration,
        "consumer_passes": consumed_run["passes"],
        "pass_p50_ms": consumed_run["pass_p50_ms"],
        "pass_max_ms": consumed_run["pass_max_ms"],
        "consumer_failures": dict(
            Counter(consumed_run["failures"])
            + Counter(consumed_run["drain"]["failures"])
            + Counter(drained["failures"])
        ),
        "consumer_db_errors": consumed_run["db_errors"],
        "drain_passes": consumed_run["drain"]["passes"] + drained["passes"],
        "latest_deadlock": _latest_deadlock(engine),
        "queue_rows_left": left,
        "problems": problems,
    }


def compare(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per database and hold: unconsumed events, stock vs plug-in; a problem if the plug-in's exceed."""
    by_key: dict[tuple[str, float], dict[str, dict[str, Any]]] = defaultdict(dict)
    for cell in cells:
        by_key[(cell["db"], cell["hold_ms"])][cell["manager"]] = cell
    out = []
    for (db, hold), managers in by_key.items():
        if "stock" not in managers or "plugin" not in managers:
            continue
        stock, plugin = managers["stock"], managers["plugin"]
        row: dict[str, Any] = {
            "db": db,
            "hold_ms": hold,
            "stock_unconsumed": stock["unconsumed"],
            "plugin_unconsumed": plugin["unconsumed"],
            "stock_unconsumed_pairs": stock["unconsumed_pairs"],
            "plugin_unconsumed_pairs": plugin["unconsumed_pairs"],
        }
        if plugin["unconsumed"] > stock["unconsumed"]:
            row["problem"] = (
                f"{db} hold {hold:g} ms: the plug-in left {plugin['unconsumed']} events unconsumed, "
                f"stock {stock['unconsumed']}"
            )
        out.append(row)
    return out


# --- report ------------------------------------------------------------------------------

_LEGEND = """\
Legend: each row is one cell: `producers` processes of one asset manager, each committing
`transactions` task-success transactions (one outlet, held open `hold` ms before COMMIT) through
Airflow's TaskInstance.register_asset_changes_in_db, while Airflow's own scheduler method
(SchedulerJobRunner._create_dagruns_for_dags -> _create_dag_runs_asset_triggered) creates runs of the
asset's consumer DAGs. events: committed events (= committed transactions); consumed: every consumer
DAG consumed the event in a run created during the round or its drain; late: consumed, by some DAG only
in the run a sentinel event triggered afterwards (its queue row already existed, so it waited for the
next run); unconsumed: some consumer DAG's runs never consumed it (in no row of dagrun_asset_event
for that DAG); in no run: consumed by no DAG at all. pairs c/l/u: the same per (event, consumer DAG).
dup: pairs consumed by two runs of the same DAG. runs: asset-triggered runs created (QUEUED), of which
the sentinel's. errors p/c: retryable database errors (deadlocks ...) of the producers (each replays
its transaction) / of the consumer (Airflow's @retry_db_transaction retries its pass)."""


def format_tables(raw: dict[str, Any]) -> str:
    """The accounting table (Markdown) with its legend and the comparison."""
    sizes = raw["sizes"]
    lines = [
        "## Event accounting through Apache Airflow "
        f"{raw.get('airflow_version', '?')}: stock AssetManager vs airflow-adrq's plug-in",
        "",
        f"{sizes['producers']} producers per manager x {sizes['transactions']} transactions, "
        f"{sizes['consumers']} consumer DAGs, consumer pass every {sizes['consumer_pause_ms']:g} ms; "
        f"{raw.get('cpus')} CPUs, load average {_load(raw)}.",
        "",
        "| database | hold | manager | events | consumed | late | unconsumed | in no run "
        "| pairs c/l/u | dup | runs (sentinel) | errors p/c | round s |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    for c in raw["cells"]:
        errors = f"{sum(c['producer_failures'].values())}/{sum(c['consumer_db_errors'].values())}"
        lines.append(
            f"| {c['db']} | {c['hold_ms']:g} ms | {c['manager']} | {c['events']} | {c['consumed']} | "
            f"{c['late']} | **{c['unconsumed']}** | {c['in_no_run']} | "
            f"{c['consumed_pairs']}/{c['late_pairs']}/{c['unconsumed_pairs']} | {c['duplicate_pairs']} | "
            f"{c['runs']} ({c['runs'] - c['runs_before_sentinel']}) | {errors} | {c['duration_s']:.1f} |"
        )
    lines += ["", _LEGEND, ""]
    for row in raw.get("comparison", []):
        verdict = "fewer" if row["plugin_unconsumed"] < row["stock_unconsumed"] else "not more"
        if row.get("problem"):
            verdict = "MORE"
        lines.append(
            f"* {row['db']}, hold {row['hold_ms']:g} ms: unconsumed events stock {row['stock_unconsumed']}, "
            f"plug-in {row['plugin_unconsumed']} ({verdict}); pairs {row['stock_unconsumed_pairs']} vs "
            f"{row['plugin_unconsumed_pairs']}"
        )
    versions = ", ".join(f"{t['name']}: {t['version']}" for t in raw["targets"])
    lines += ["", f"Databases: {versions}. Took {raw.get('duration_s', math.nan):.0f} s."]
    if raw["problems"]:
        lines += ["", "Problems:", *[f"* {p}" for p in raw["problems"]]]
    return "\n".join(lines) + "\n"


def _load(raw: dict[str, Any]) -> str:
    load = raw.get("load_average", {})
    parts = [f"{k} {v[0]:.2f}" for k, v in load.items() if v]
    return ", ".join(parts) or "?"


# --- command line -----------------------------------------------------------------


def build_parser(prog: str = "airflow-adrq bench --airflow --accounting") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Asset events that no run consumes, through Apache Airflow 3.3's own code: stock AssetManager "
            "vs airflow-adrq's plug-in as producers (TaskInstance.register_asset_changes_in_db), Airflow's "
            "scheduler method _create_dag_runs_asset_triggered as the consumer, on scratch databases made "
            "by `airflow db migrate`. Without --db: SQLite plus every PostgreSQL and MySQL/MariaDB server "
            "found (see airflow_adrq_bench.servers)."
        ),
    )
    parser.add_argument("--airflow", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--accounting", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--db",
        action="append",
        metavar="URL",
        help="measure on this server (repeatable): a scratch database is created there and dropped",
    )
    parser.add_argument(
        "--backend", action="append", choices=_BACKENDS, help="without --db: only these (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller cells")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: bench-results/airflow-accounting-<UTC time>)",
    )
    group = parser.add_argument_group("sizes")
    for field in dataclasses.fields(AccountingSizes):
        kind: Callable[[str], Any] = _float_list if field.name == "holds_ms" else _number(str(field.type))
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=kind,
            default=None,
            dest=field.name,
            help=f"{_SIZE_HELP[field.name]} (default {_show(getattr(DEFAULT, field.name))}, "
            f"--quick {_show(getattr(QUICK, field.name))})",
        )
    return parser


def _number(kind: str) -> Callable[[str], Any]:
    return int if kind == "int" else float


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, not {text!r}") from None


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accounting mode; returns the exit status (1: a check failed or the plug-in lost more)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.db and args.backend:
        parser.error("--backend selects among the servers found without --db; give one or the other")
    if importlib.util.find_spec("airflow") is None:
        _say(
            "airflow-adrq bench --airflow --accounting: error: needs apache-airflow-core 3.3 in this "
            "environment (from a checkout: tox -e airflow-bench)"
        )
        return 1
    base = QUICK if args.quick else DEFAULT
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(AccountingSizes)
        if getattr(args, f.name) is not None
    }
    try:
        sizes = dataclasses.replace(base, **overrides)
    except ValueError as exc:
        parser.error(str(exc))
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    out: Path = args.out or Path("bench-results") / f"airflow-accounting-{stamp}"
    try:
        with _targets(args) as targets:
            raw = run(targets, sizes, progress=_say)
    except (AdrqError, SQLAlchemyError) as exc:
        _say(f"airflow-adrq bench --airflow --accounting: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("airflow-adrq bench --airflow --accounting: interrupted (processes stopped, scratch dropped)")
        return 130
    text = format_tables(raw)
    out.mkdir(parents=True, exist_ok=True)
    (out / "airflow-accounting.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    (out / "airflow-accounting.md").write_text(text)
    print(text)
    print(f"wrote {out / 'airflow-accounting.json'}, {out / 'airflow-accounting.md'}")
    for problem in raw["problems"]:
        _say(f"ERROR: {problem}")
    return 1 if raw["problems"] else 0


@contextlib.contextmanager
def _targets(args: argparse.Namespace) -> Iterator[list[run_module.Target]]:
    with run_module.targets(args.db or [], args.backend, sqlite=True, say=_say) as targets:
        yield targets
