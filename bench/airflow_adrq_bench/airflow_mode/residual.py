"""The residual race through Airflow's own code: producers of *different* assets feeding one DAG.

::

    python -m airflow_adrq_bench.airflow_mode.residual --db postgresql://root@127.0.0.1/postgres

Needs apache-airflow-core 3.3.2. :mod:`airflow_adrq_bench.residual` runs the
race against a copy of the scheduler's step; this runs it against the
scheduler itself. Per manager (``stock``: Airflow's ``AssetManager``;
``plugin``: airflow-adrq's ``AdrqAssetManager``), on a scratch database made
by ``airflow db migrate``: ``--producers`` threads, each calling the
manager's own ``register_asset_change`` for an asset of its own and
committing, back to back; one consumer DAG on ``a0 | a1 | ...``, serialized
by Airflow's DAG-processing code; one thread running
``SchedulerJobRunner._create_dagruns_for_dags`` (``DagModel.dags_needing_dagruns``,
then ``_create_dag_runs_asset_triggered``) pass after pass, as the scheduler
loop calls it. Then the queue is drained and every event's runs are counted
from ``dagrun_asset_event``: *lost* (no run), *consumed twice*.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import operator
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_BUNDLE as BUNDLE
from airflow_adrq_bench.airflow_mode.databases import describe, scratch_database
from airflow_adrq_bench.airflow_mode.processes import (
    AirflowOrm,
    airflow_settings,
    apply_environment,
    clean_environ,
    start_migrate,
    wait_migrate,
)
from airflow_adrq_bench.airflow_mode.worker import asset_uri

CONSUMER = "adrq_residual_consumer"
MANAGERS = ("stock", "plugin")


@dataclass
class Outcome:
    manager: str
    events: int = 0
    runs: int = 0
    lost: int = 0
    twice: int = 0
    #: Producer transactions that failed (deadlock ...), by error; not retried.
    failed: Counter[str] | None = None
    scheduler_passes: int = 0

    HEADER = (
        "| manager | events | events/s | runs | scheduler passes | failed producer tx | lost "
        "| consumed twice |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )

    def line(self, seconds: float) -> str:
        failed = sum((self.failed or Counter()).values())
        return (
            f"| {self.manager} | {self.events} | {self.events / seconds:.0f} | {self.runs} "
            f"| {self.scheduler_passes} | {failed} | {self.lost} | {self.twice} |"
        )


def _manager(name: str) -> Any:
    if name == "stock":
        from airflow.assets.manager import AssetManager

        return AssetManager
    from airflow_adrq.airflow import AdrqAssetManager

    return AdrqAssetManager


def _seed(orm: AirflowOrm, assets: list[str]) -> None:
    """The consumer DAG on ``a0 | a1 | ...``, written by Airflow's DAG-processing code, unpaused."""
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.models.asset import AssetActive, AssetModel
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.sdk import DAG, Asset
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    schedule = functools.reduce(operator.or_, [Asset(name=n, uri=asset_uri(n)) for n in assets])
    dag = DAG(CONSUMER, schedule=schedule, max_active_runs=1_000_000)
    with orm.session_factory() as session:
        session.add(DagBundleModel(name=BUNDLE))
        session.commit()
        update_dag_parsing_results_in_db(
            BUNDLE, None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session=session
        )
        session.commit()
        session.execute(sa.update(DagModel).where(DagModel.dag_id == CONSUMER).values(is_paused=False))
        for model in session.scalars(sa.select(AssetModel).where(AssetModel.name.in_(assets))):
            if model.active is None:
                session.add(AssetActive.for_asset(model))
        session.commit()


def _scheduler_pass(orm: AirflowOrm, runner: Any, failures: Counter[str]) -> None:
    from airflow.utils.sqlalchemy import prohibit_commit

    session = orm.session_factory()
    try:
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard, session)
    except sa.exc.DBAPIError as exc:  # its own @retry_db_transaction gave up: the next pass retries
        session.rollback()
        failures[type(exc.orig).__name__] += 1
    finally:
        session.close()


def measure(url: str, manager: str, *, producers: int, seconds: float) -> Outcome:
    """One manager on the migrated scratch database ``url`` (Airflow's ORM is pointed at it here)."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    orm = AirflowOrm()
    orm.point_at(url)
    try:
        assets = [f"res_a{i}" for i in range(producers)]
        _seed(orm, assets)
        job = Job()
        with orm.session_factory() as session:
            session.add(job)
            session.commit()
        runner = SchedulerJobRunner(job=job)
        cls = _manager(manager)
        out = Outcome(manager, failed=Counter())
        stop = threading.Event()
        lock = threading.Lock()
        failures: Counter[str] = Counter()

        def produce(name: str) -> None:
            key = SerializedAssetUniqueKey(name=name, uri=asset_uri(name))
            while not stop.is_set():
                session = orm.session_factory()
                try:
                    cls.register_asset_change(asset=key, session=session)
                    session.commit()
                except sa.exc.DBAPIError as exc:
                    session.rollback()
                    with lock:
                        assert out.failed is not None
                        out.failed[type(exc.orig).__name__] += 1
                finally:
                    session.close()

        def schedule() -> None:
            while not stop.is_set():
                _scheduler_pass(orm, runner, failures)
                out.scheduler_passes += 1

        threads = [threading.Thread(target=produce, args=(name,)) for name in assets]
        threads.append(threading.Thread(target=schedule))
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        with orm.engine.connect() as conn:
            for _ in range(200):  # drain: every committed queue row becomes a run
                if not conn.execute(sa.text("SELECT count(*) FROM asset_dag_run_queue")).scalar():
                    break
                conn.rollback()
                _scheduler_pass(orm, runner, failures)
            events = [int(e) for e in conn.execute(sa.text("SELECT id FROM asset_event")).scalars()]
            consumed = Counter(
                int(e)
                for e in conn.execute(
                    sa.text(
                        "SELECT x.event_id FROM dagrun_asset_event x JOIN dag_run r ON r.id = x.dag_run_id "
                        "WHERE r.dag_id = :d"
                    ),
                    {"d": CONSUMER},
                ).scalars()
            )
            out.runs = int(
                conn.execute(
                    sa.text("SELECT count(*) FROM dag_run WHERE dag_id = :d"), {"d": CONSUMER}
                ).scalar()
                or 0
            )
        out.events = len(events)
        out.lost = sum(1 for e in events if consumed[e] == 0)
        out.twice = sum(1 for e in events if consumed[e] > 1)
        return out
    finally:
        orm.release()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_adrq_bench.airflow_mode.residual", description=__doc__, allow_abbrev=False
    )
    parser.add_argument(
        "--db", required=True, help="server URL: scratch databases are created on it, then dropped"
    )
    parser.add_argument("--producers", type=int, default=4, help="producer threads, one asset each")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds each manager runs")
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (default: both)")
    args = parser.parse_args(argv)
    target = describe(args.db)
    workdir = Path(tempfile.mkdtemp(prefix="adrq-residual-airflow-"))
    managers = args.manager or list(MANAGERS)
    with contextlib.ExitStack() as stack:
        urls = {m: stack.enter_context(scratch_database(target, workdir)) for m in managers}
        for manager, url in urls.items():
            log = workdir / f"db-migrate-{manager}.log"
            wait_migrate(start_migrate(clean_environ(airflow_settings(workdir, url)), log), log)
        apply_environment(airflow_settings(workdir, urls[managers[0]]))
        import airflow  # noqa: F401  (after the settings: Airflow reads them at import)

        print(
            f"{target.version}; Airflow's own scheduler; {args.producers} producers, {args.seconds:g} s each"
        )
        print(Outcome.HEADER)
        for manager in managers:
            found = measure(urls[manager], manager, producers=args.producers, seconds=args.seconds)
            print(found.line(args.seconds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
