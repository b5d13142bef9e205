"""Where one ``register_asset_change`` + COMMIT spends its time, stock Airflow and the plug-in side by side.

Run it in an environment with Apache Airflow (``tox -e airflow33 --notest``,
then ``.tox/airflow33/bin/python``) against a database made by
``airflow db migrate``::

    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://root@127.0.0.1/prof airflow db migrate
    python benchmarks/profile_plugin.py --db postgresql+psycopg2://root@127.0.0.1/prof \
        --fanouts 1,16,64,1024 --calls 300 [--pyinstrument OUT_DIR] [--explain]

One process, one caller, one asset per fan-out with that many unpaused
consumer DAGs (direct references), an empty queue before every call. Calls
alternate between Airflow's own ``AssetManager`` and
``airflow_adrq.airflow.AdrqAssetManager`` (first one, then the other, then
the other way round), so both see the same machine. Printed per manager and
fan-out: the p50 and p90 of the call + COMMIT, the statements sent, and the
p50 time per step, measured around the driver's ``cursor.execute`` (the
round trip and the server's work) and the DBAPI COMMIT; what is left is
Python (Airflow's, SQLAlchemy's and ours). ``--pyinstrument`` writes a sampling
profile of each cell; ``--route`` counts, for one warm call + COMMIT per manager
and fan-out, the Python calls into ``airflow_adrq`` (``sys.setprofile``:
functions, per file) and the statements sent, the route a maintainer follows
from ``register_asset_change`` to the SQL; ``--explain`` prints the server's
plan and timing of the plug-in's queue statement (PostgreSQL ``EXPLAIN (ANALYZE, BUFFERS)``,
MariaDB ``ANALYZE FORMAT=JSON``), in a transaction rolled back afterwards.

Not part of either distribution: a tool for BENCHMARKS.md's profile section.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: A statement's step, by the start of its SQL (first match wins).
STEPS = [
    ("lookup", r"SELECT asset\.id"),
    ("aliases", r"SELECT asset_alias\."),
    ("event", r"INSERT INTO asset_event"),
    ("consumers", r"SELECT dag\.dag_id"),
    ("queue", r"(WITH ev AS|INSERT INTO asset_dag_run_queue|SELECT asset_dag_run_queue)"),
    ("stamp", r"(WITH stamped_events|SELECT utc_timestamp|UPDATE asset_event|UPDATE asset_dag_run_queue)"),
    ("savepoint", r"(SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT)"),
]


def _step(sql: str) -> str:
    return next((name for name, pattern in STEPS if re.match(pattern, sql.lstrip())), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--db", required=True, help="a database made by `airflow db migrate` (SQLAlchemy URL)"
    )
    parser.add_argument("--fanouts", default="1,16,64,1024")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per manager and fan-out")
    parser.add_argument("--pyinstrument", type=Path, help="write a pyinstrument profile per cell here")
    parser.add_argument("--explain", action="store_true", help="print the queue statement's server plan")
    route = "count the calls into airflow_adrq of one warm call"
    parser.add_argument("--route", action="store_true", help=route)
    args = parser.parse_args()
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = args.db
    import sqlalchemy as sa
    from airflow import settings

    settings.configure_orm()
    from airflow.assets.manager import AssetManager
    from airflow.models.asset import AssetActive, AssetDagRunQueue, AssetModel, DagScheduleAssetReference
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    from airflow_adrq.airflow import AdrqAssetManager

    fanouts = [int(f) for f in args.fanouts.split(",")]
    tag = f"prof{os.getpid()}"
    with settings.Session() as session:
        session.add(DagBundleModel(name=tag))
        session.flush()
        dags = [f"{tag}_c{i:05d}" for i in range(max(fanouts))]
        for dag_id in dags:
            session.add(
                DagModel(
                    dag_id=dag_id,
                    bundle_name=tag,
                    is_paused=False,
                    is_stale=False,
                    timetable_partitioned=False,
                )
            )
        session.flush()
        for fanout in fanouts:
            asset = AssetModel(name=f"{tag}_a{fanout}", uri=f"s3://{tag}/a{fanout}", group="asset")
            session.add(asset)
            session.flush()
            session.add(AssetActive.for_asset(asset))
            session.add_all(DagScheduleAssetReference(asset_id=asset.id, dag_id=d) for d in dags[:fanout])
        session.commit()

    #: (step, start, seconds) of every statement of the current call.
    executed: list[tuple[str, float, float]] = []
    started: list[float] = []
    engine = settings.engine

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _before(*_: Any) -> None:
        started.append(time.perf_counter())

    #: When the DBAPI COMMIT was sent, and when the session saw it done.
    # (after_commit also fires when a SAVEPOINT is released: the last one is the COMMIT's.)
    commit_sent: list[float] = []
    commit_done: list[float] = []
    sa.event.listen(engine, "commit", lambda _conn: commit_sent.append(time.perf_counter()))
    sa.event.listen(sa.orm.Session, "after_commit", lambda _s: commit_done.append(time.perf_counter()))

    #: The last queue statement sent, with its parameters, for --explain.
    last_queue: list[tuple[str, Any]] = []

    @sa.event.listens_for(engine, "after_cursor_execute")
    def _after(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        start = started.pop()
        executed.append((_step(statement), start, time.perf_counter() - start))
        if statement.lstrip().startswith("WITH ev AS"):
            last_queue[:] = [(statement, parameters)]

    task_instance = SimpleNamespace(dag_id=f"{tag}_p", task_id="t", run_id="r", map_index=-1, log=None)
    managers = {"stock": AssetManager(), "plug-in": AdrqAssetManager()}

    def call(manager: Any, fanout: int, steps: dict[str, list[float]], route: Any = None) -> float:
        key = SerializedAssetUniqueKey(name=f"{tag}_a{fanout}", uri=f"s3://{tag}/a{fanout}")
        executed.clear()
        commit_sent.clear()
        with settings.Session() as session, route or contextlib.nullcontext():
            start = time.perf_counter()
            manager.register_asset_change(task_instance=task_instance, asset=key, session=session)
            session.commit()
            end = time.perf_counter()
        sent = len(executed)
        per_step: collections.Counter[str] = collections.Counter()
        for step, _, seconds in executed:
            per_step[step] += seconds
        # The DBAPI COMMIT: from the engine's commit event to the session's after_commit.
        per_step["COMMIT"] = commit_done[-1] - commit_sent[0]
        per_step["python"] = (end - start) - sum(per_step.values())
        for step, seconds in per_step.items():
            steps[step].append(seconds)
        steps["statements"].append(float(sent))
        with settings.Session() as session:
            session.execute(sa.delete(AssetDagRunQueue))
            session.commit()
        return end - start

    if args.route:
        for fanout in fanouts:
            for name, manager in managers.items():
                call(manager, fanout, collections.defaultdict(list))  # warm: caches, listeners, imports
                steps = collections.defaultdict(list)
                call(manager, fanout, steps, route := _Route())
                print(f"F={fanout:<5} {name:<8} {route.summary(int(steps['statements'][0]))}")
        return
    for fanout in fanouts:
        calls = args.calls if fanout < 1024 else max(20, args.calls // 10)
        latencies: dict[str, list[float]] = {name: [] for name in managers}
        steps: dict[str, dict[str, list[float]]] = {name: collections.defaultdict(list) for name in managers}
        profilers = {}
        if args.pyinstrument:
            import pyinstrument

            profilers = {name: pyinstrument.Profiler(interval=0.0001) for name in managers}
        for n in range(calls + 10):
            order = list(managers.items()) if n % 2 else list(reversed(managers.items()))
            for name, manager in order:
                profiler = profilers.get(name) if n >= 10 else None
                if profiler:
                    profiler.start()
                latency = call(manager, fanout, steps[name] if n >= 10 else collections.defaultdict(list))
                if profiler:
                    profiler.stop()
                if n >= 10:
                    latencies[name].append(latency)
        for name in managers:
            xs = sorted(latencies[name])
            p90 = statistics.quantiles(xs, n=10)[-1]
            parts = ", ".join(
                f"{step} {statistics.median(values) * 1000:.2f}"
                for step, values in sorted(steps[name].items())
                if step != "statements"
            )
            print(
                f"F={fanout:<5} {name:<8} p50 {statistics.median(xs) * 1000:7.2f} ms  "
                f"p90 {p90 * 1000:7.2f} ms  "
                f"statements {statistics.median(steps[name]['statements']):.0f}  steps p50 ms: {parts}"
            )
        ratio = statistics.median(latencies["stock"]) / statistics.median(latencies["plug-in"])
        print(f"F={fanout:<5} stock / plug-in p50: {ratio:.2f}x")
        for name, profiler in profilers.items():
            args.pyinstrument.mkdir(parents=True, exist_ok=True)
            out = args.pyinstrument / f"{name}-F{fanout}.txt"
            out.write_text(profiler.output_text(unicode=False, show_all=False))
        sys.stdout.flush()
    if args.explain:
        _explain(engine, *last_queue[0])


class _Route:
    """Python calls into the installed ``airflow_adrq`` while it is entered."""

    def __init__(self) -> None:
        import airflow_adrq

        self.root = str(Path(airflow_adrq.__file__).resolve().parent)
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def _profile(self, frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(self.root):
            where = frame.f_code.co_filename[len(self.root) + 1 :]
            self.calls[(where, frame.f_code.co_qualname)] += 1

    def __enter__(self) -> _Route:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *_: object) -> None:
        sys.setprofile(None)

    def summary(self, statements: int) -> str:
        files = collections.Counter[str]()
        for (where, _), n in self.calls.items():
            files[where] += n
        per_file = ", ".join(f"{where} {n}" for where, n in files.most_common())
        if os.environ.get("ROUTE_DETAIL"):
            per_file += "".join(f"\n    {n:3d} {w}:{f}" for (w, f), n in sorted(self.calls.items()))
        return (
            f"{sum(self.calls.values())} calls, {len(self.calls)} functions in {len(files)} files, "
            f"{statements} statements: {per_file}"
        )


def _explain(engine: Any, statement: str, parameters: Any) -> None:
    """The server's plan and timing of the plug-in's last queue statement, in a rolled-back transaction."""
    with engine.connect() as conn, conn.begin() as trans:
        prefix = (
            "EXPLAIN (ANALYZE, BUFFERS) " if conn.dialect.name == "postgresql" else "ANALYZE FORMAT=JSON "
        )
        for row in conn.exec_driver_sql(prefix + statement, parameters):
            print(row[0])
        trans.rollback()


if __name__ == "__main__":
    main()
