"""The consumer: Airflow's own ``SchedulerJobRunner._create_dagruns_for_dags`` on real serialized DAGs,
in a process of its own (:class:`Consumer`, one per scheduler); the functions below run there. The same
process runs one of :mod:`.writers`' loops instead with ``--dag-writers``."""

from __future__ import annotations

import functools
import operator
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq.retry import classify
from airflow_adrq_bench.airflow_mode.databases import fetch
from airflow_adrq_bench.airflow_mode.processes import SPAWN, AirflowOrm, Child, airflow_settings
from airflow_adrq_bench.airflow_mode.worker import asset_uri

#: The DAG bundle of the serialized DAGs (what the DAG processor syncs).
BUNDLE = "adrq-accounting-bundle"


class _Consumer(AirflowOrm):
    def __init__(self, started: Any, stop: Any) -> None:
        self.started, self.stop = started, stop
        self.runner: Any = None
        #: Wall-clock (start, end) of every pass since :func:`consume` began: a run created in a pass is
        #: visible to others from its end (the pass's COMMIT).
        self.passes: list[tuple[float, float]] = []
        # Database errors the consumer's connections raised, including those
        # @retry_db_transaction retried inside a pass (never seen otherwise).
        self.db_errors: Counter[str] = Counter()

    def count_error(self, context: Any) -> None:
        found = classify(context.sqlalchemy_exception or context.original_exception)
        self.db_errors[found.kind.value if found else type(context.original_exception).__name__] += 1


_consumer: _Consumer


def setup(started: Any, stop: Any) -> None:
    import airflow.jobs.scheduler_job_runner  # noqa: F401  (the slow import, done once here)

    global _consumer
    _consumer = _Consumer(started, stop)


def target(url: str) -> str:
    """Point Airflow's ORM at ``url`` (as the workers do), with a ``SchedulerJobRunner`` whose loop never
    runs, on a new ``Job`` row there; the dialect's name."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    sa.event.listen(_consumer.point_at(url), "handle_error", _consumer.count_error)
    job = Job()
    with _consumer.session_factory() as session:
        session.add(job)
        session.commit()
    _consumer.runner = SchedulerJobRunner(job=job)
    return str(_consumer.engine.dialect.name)


def dags(schedules: dict[str, list[str]]) -> list[Any]:
    """The consumer DAGs ``{dag_id: the assets it is scheduled on (any of them)}``, as :func:`seed` and
    the DAG processor's loop (:mod:`.writers`) define them (the same file: the same ``fileloc``)."""
    from airflow.sdk import DAG, Asset

    found = []
    for dag_id, names in schedules.items():
        schedule = functools.reduce(operator.or_, [Asset(name=n, uri=asset_uri(n)) for n in names])
        found.append(DAG(dag_id, schedule=schedule, max_active_runs=1_000_000))
    return found


def seed(schedules: dict[str, list[str]], producer_dag: str) -> dict[str, int]:
    """Serialize and write, with Airflow's DAG-processing code, the consumer DAGs ``{dag_id: the assets it is
    scheduled on (any of them)}`` and ``producer_dag`` (unscheduled); returns the asset ids.

    The DAGs are unpaused; ``max_active_runs`` is high, since the runs stay QUEUED."""
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.models.asset import AssetActive, AssetModel
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    with _consumer.session_factory() as session:
        session.add(DagBundleModel(name=BUNDLE))
        session.commit()
        every = [DAG(producer_dag, schedule=None), *dags(schedules)]
        serialized = [LazyDeserializedDAG.from_dag(dag) for dag in every]
        update_dag_parsing_results_in_db(BUNDLE, None, serialized, {}, None, set(), session=session)
        session.commit()
        session.execute(sa.update(DagModel).values(is_paused=False))
        ids: dict[str, int] = {}
        for model in session.scalars(sa.select(AssetModel)):
            ids[model.name] = model.id
            if model.active is None:
                session.add(AssetActive.for_asset(model))
        session.commit()
        query = sa.select(DagModel.asset_expression).where(DagModel.dag_id.in_(list(schedules)))
        if any(expression is None for expression in session.execute(query).scalars()):
            raise RuntimeError("a consumer DAG has no asset_expression after serialization")
    if missing := {n for names in schedules.values() for n in names} - set(ids):
        raise RuntimeError(f"assets not written by the DAG sync: {sorted(missing)}")
    return ids


def _pass(failures: Counter[str]) -> float:
    """One ``_create_dagruns_for_dags`` under ``prohibit_commit``, as the scheduler loop calls it; seconds."""
    from airflow.utils.sqlalchemy import prohibit_commit

    start, began = time.perf_counter(), time.time()
    session = _consumer.session_factory()
    try:
        with prohibit_commit(session) as guard:
            _consumer.runner._create_dagruns_for_dags(guard, session)
    except Exception as exc:
        # Its own @retry_db_transaction gave up: the next pass tries again.
        found = classify(exc)
        if found is None:
            raise
        session.rollback()
        failures[found.kind.value] += 1
    finally:
        session.close()
        _consumer.passes.append((began, time.time()))
    return time.perf_counter() - start


def release() -> None:
    _consumer.release()


def runs(dag_ids: list[str]) -> list[tuple[int, int | None, float | None]]:
    """``(id, creating_job_id, queued_at as epoch seconds)`` of every run of ``dag_ids``, through Airflow's
    model (its ``UtcDateTime`` reads the stamp as UTC on every backend)."""
    from airflow.models.dagrun import DagRun

    query = sa.select(DagRun.id, DagRun.creating_job_id, DagRun.queued_at).where(DagRun.dag_id.in_(dag_ids))
    with _consumer.session_factory() as session:
        rows = session.execute(query).all()
    return [(int(i), job, None if at is None else at.timestamp()) for i, job, at in rows]


def drain(dag_ids: list[str], max_passes: int = 500) -> dict[str, Any]:
    """Pass until none of ``dag_ids``' queue rows is left (every committed row became a run)."""
    sql = "SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id IN :dags"

    def left() -> int:
        with _consumer.session_factory() as session:
            return int(fetch(session.connection(), sql, dags=dag_ids)[0][0])

    failures: Counter[str] = Counter()
    passes = 0
    while left() and passes < max_passes:
        _pass(failures)
        passes += 1
    return {"passes": passes, "failures": dict(failures), "queue_rows_left": left()}


def consume(dag_ids: list[str], pause_s: float) -> dict[str, Any]:
    """Pass continuously until the controller sets ``stop``, then drain; sets ``started`` after the first
    pass (the producers start with the consumer already running)."""
    failures: Counter[str] = Counter()
    _consumer.db_errors.clear()
    _consumer.passes.clear()
    pass_s = [_pass(failures)]
    _consumer.started.set()
    while not _consumer.stop.is_set():
        pass_s.append(_pass(failures))
        time.sleep(pause_s)
    ms = sorted(s * 1000 for s in pass_s)
    return {
        "passes": len(pass_s),
        "pass_p50_ms": statistics.median(ms),
        "pass_max_ms": ms[-1],
        "failures": dict(failures),
        "db_errors": dict(_consumer.db_errors),
        "drain": drain(dag_ids),
        "job_id": _consumer.runner.job.id,
        "intervals": list(_consumer.passes),
    }


class Consumer(Child):
    """The controller's handle on a consumer process (the spawn context's events are its signals): a
    scheduler, or one of :mod:`.writers`' loops."""

    def __init__(self, home: Path, label: str = "the consumer") -> None:
        self.started_event, self.stop_event = SPAWN.Event(), SPAWN.Event()
        settings = airflow_settings(home, f"sqlite:///{home}/unused.db")
        super().__init__(label, settings, setup, self.started_event, self.stop_event)

    def begin(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        """Start ``function(*args)`` (a loop until ``stop``) and wait until it set ``started``."""
        self.started_event.clear()
        self.stop_event.clear()
        future = self.submit(function, *args)
        while not self.started_event.wait(1.0):
            if future.done():
                self.result(future)  # it failed: raise
        return future


#: A loop for :func:`during`: the process, the function (one of this module's or :mod:`.writers`'), its args.
Loop = tuple[Consumer, Callable[..., Any], tuple[Any, ...]]


def during(loops: Sequence[Loop], work: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """``work()``'s result while every ``(process, loop, args)`` runs (each from after its first pass), and
    each loop's result, in order."""
    futures: list[tuple[Consumer, Future[Any]]] = []
    try:
        for proc, function, args in loops:
            futures.append((proc, proc.begin(function, *args)))
        done = work()
    finally:
        for proc, _ in futures:
            proc.stop_event.set()
    return done, [proc.result(future) for proc, future in futures]
