"""The consumer process: Airflow's own ``SchedulerJobRunner._create_dagruns_for_dags`` (imports Airflow)."""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_BUNDLE as BUNDLE
from airflow_adrq_bench.airflow_mode.processes import AirflowOrm, Child, Setup, serve, spawn
from airflow_adrq_bench.airflow_mode.worker import PRODUCER_DAG, asset_uri

_QUEUED = sa.text("SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id IN :dags")


class _Consumer(AirflowOrm):
    """Airflow's scheduler method on a ``SchedulerJobRunner`` whose loop never runs."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.runner: Any = None
        #: Database errors the consumer's connections raised, including those
        #: ``@retry_db_transaction`` retried inside a pass (never seen otherwise).
        self.db_errors: Counter[str] = Counter()

    def target(self, url: str) -> dict[str, Any]:
        """Point Airflow's ORM at ``url`` (as :mod:`.worker` does); a new ``Job`` and runner there."""
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

        sa.event.listen(self.point_at(url), "handle_error", self._count_error)
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


def consumer_main(conn: Any, env: dict[str, str]) -> None:
    """Consumer process: import Airflow (its default asset manager), then serve commands until ``close``."""

    def setup() -> Setup:
        import airflow
        import airflow.jobs.scheduler_job_runner  # the slow import, done once here

        consumer = _Consumer(conn)
        commands: dict[str, Callable[..., Any]] = {
            "target": consumer.target,
            "release": consumer.release,
            "seed": consumer.seed,
            "drain": consumer.drain,
            "consume": consumer.consume,
        }
        return {"pid": os.getpid(), "airflow": str(airflow.__version__)}, commands, consumer.release

    serve(conn, env, setup)


def start_consumer(env: dict[str, str]) -> Child:
    """Spawn the consumer process (:func:`consumer_main`); its start-up info is its first answer."""
    return spawn("the consumer", consumer_main, env)
