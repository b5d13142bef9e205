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
from pathlib import Path

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.accounting.classify import classify
from airflow_adrq_bench.airflow_mode.accounting.consumer import new_runner, scheduler_pass, write_dags
from airflow_adrq_bench.airflow_mode.databases import describe, fetch, migrated, queue_rows
from airflow_adrq_bench.airflow_mode.processes import AirflowOrm, airflow_settings, apply_environment
from airflow_adrq_bench.airflow_mode.worker import asset_uri

CONSUMER = "adrq_residual_consumer"
MANAGERS = ("stock", "plugin")
HEADER = (
    "| manager | events | events/s | runs | scheduler passes | failed producer tx | lost | consumed twice |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|"
)


def measure(url: str, manager: str, *, producers: int, seconds: float) -> str:
    """One manager on the migrated scratch database ``url``; its row of the table."""
    from airflow.assets.manager import AssetManager
    from airflow.sdk import Asset
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    from airflow_adrq.airflow import AdrqAssetManager

    cls = AssetManager if manager == "stock" else AdrqAssetManager
    orm = AirflowOrm()
    orm.point_at(url)
    try:
        assets = [f"res_a{i}" for i in range(producers)]
        write_dags(
            orm, {CONSUMER: functools.reduce(operator.or_, [Asset(name=n, uri=asset_uri(n)) for n in assets])}
        )
        runner = new_runner(orm)
        stop = threading.Event()
        failed: Counter[str] = Counter()  # producer transactions that failed (deadlock ...), not retried
        passes: Counter[str] = Counter()

        def produce(name: str) -> None:
            key = SerializedAssetUniqueKey(name=name, uri=asset_uri(name))
            while not stop.is_set():
                with orm.session_factory() as session:
                    try:
                        cls.register_asset_change(asset=key, session=session)
                        session.commit()
                    except sa.exc.DBAPIError as exc:
                        session.rollback()
                        failed[type(exc.orig).__name__] += 1

        def schedule() -> None:
            while not stop.is_set():
                scheduler_pass(orm, runner, Counter())
                passes["passes"] += 1

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
                if not queue_rows(conn):
                    break
                conn.rollback()
                scheduler_pass(orm, runner, Counter())
            events = [int(e) for (e,) in fetch(conn, "SELECT id FROM asset_event")]
            runs = fetch(conn, "SELECT id FROM dag_run WHERE dag_id = :d", d=CONSUMER)
            consumed = fetch(
                conn,
                "SELECT r.id, r.dag_id, x.event_id FROM dagrun_asset_event x JOIN dag_run r "
                "ON r.id = x.dag_run_id WHERE r.dag_id = :d",
                d=CONSUMER,
            )
        # One consumer DAG: an event in no run is lost; a pair consumed by two runs, consumed twice.
        found = classify(events, [CONSUMER], consumed, cutoff=2**62, sentinel=None)
        return (
            f"| {manager} | {len(events)} | {len(events) / seconds:.0f} | {len(runs)} | {passes['passes']} "
            f"| {sum(failed.values())} | {found.in_no_run} | {found.duplicate_pairs} |"
        )
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
    managers = args.manager or list(MANAGERS)
    with tempfile.TemporaryDirectory(prefix="adrq-residual-airflow-") as tmp, contextlib.ExitStack() as stack:
        databases = stack.enter_context(migrated([target] * len(managers), Path(tmp)))
        for _, _, wait in databases:
            wait()
        apply_environment(airflow_settings(Path(tmp), databases[0][1]))
        import airflow  # noqa: F401  (after the settings: Airflow reads them at import)

        print(
            f"{target.version}; Airflow's own scheduler; {args.producers} producers, {args.seconds:g} s each"
        )
        print(HEADER)
        for manager, (_, url, _) in zip(managers, databases, strict=True):
            print(measure(url, manager, producers=args.producers, seconds=args.seconds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
