"""The producers of the Airflow modes: processes each bound to one asset manager, and their pool.

:class:`Workers` spawns ``producers`` processes per manager (:class:`.processes.Child`), producer ``i`` of
every manager with ``PYTHONHASHSEED`` ``1000 + i`` (Airflow iterates a task's outlets as a ``set``; processes
differ in that order, as API-server workers do). ``import airflow`` does not import
``airflow.assets.manager``, where ``[core] asset_manager_class`` is read: each process is given its manager's
class in its settings first, then checks that ``asset_manager`` is exactly that class (:func:`setup`). The
functions below run in those processes, on the process's one :class:`_Worker`."""

from __future__ import annotations

import itertools
import logging
import os
import pkgutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_adrq.errors import RetriesExhaustedError
from airflow_adrq.retry import Retryable, classify, run_in_transaction
from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, MANAGER_KWARGS
from airflow_adrq_bench.airflow_mode.processes import SPAWN, AirflowOrm, Child, airflow_settings, close_all

#: The DAG bundle, and the producing DAG the task-instance stand-ins belong to.
BUNDLE = "adrq-bench-bundle"
PRODUCER_DAG = "adrq_bench_producer"
#: A transaction a round's budget left no time to start (one that gave up: with its attempts, failures).
NOT_STARTED: dict[str, Any] = {"ok": False, "latency_s": None, "attempts": 0, "failures": {}, "statements": 0}


def asset_uri(name: str) -> str:
    return f"s3://adrq-bench/{name}"


class _Worker(AirflowOrm):
    def __init__(self, index: int, barrier: Any, info: dict[str, Any]) -> None:
        self.index, self.barrier, self.info = index, barrier, info
        self.statements = 0  # sent since the last reset (cursor executes; an executemany per set), BEGIN not
        # Of those, SAVEPOINT and ROLLBACK TO SAVEPOINT statements: each opens a subtransaction (--standby).
        self.savepoints = self.rollbacks_to = 0

    def count(self, _conn: Any, _cursor: Any, sql: str, parameters: Any, _context: Any, many: bool) -> None:
        head = sql.lstrip()[:11].upper()
        if head[:5] != "BEGIN":
            self.statements += len(parameters) if many and parameters else 1
        if head[:9] == "SAVEPOINT":
            self.savepoints += 1
        elif head == "ROLLBACK TO":
            self.rollbacks_to += 1

    def transaction(
        self, assets: list[str], run_id: str, hold_s: float, deadline: float, keep_going: bool = False
    ) -> dict[str, Any]:
        """Task success as Airflow's Execution API runs it: register the outlets, hold, COMMIT, then
        Airflow's callbacks (untimed). A retryable failure replays the whole transaction until ``deadline``
        (:func:`airflow_adrq.retry.run_in_transaction`); anything else is raised (``keep_going``: counted
        by its class's name, and the transaction given up). ``committed_at``: wall clock after COMMIT."""
        from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
        from airflow.models.taskinstance import TaskInstance

        outlets = [AssetProfile(name=name, uri=asset_uri(name), type="Asset") for name in assets]
        ti: Any = _task_instance(f"t{self.index}", run_id)
        failures: Counter[str] = Counter()

        savepoints, rollbacks_to = self.savepoints, self.rollbacks_to  # every attempt's, replays too

        def attempt(session: Any, _sink: list[Any]) -> Any:
            self.statements = 0
            callbacks = TaskInstance.register_asset_changes_in_db(ti, outlets, [], session=session)
            time.sleep(hold_s)
            return callbacks

        def on_retry(_n: int, found: Retryable) -> None:
            failures[found.kind.value] += 1

        start = time.monotonic()
        try:
            callbacks = run_in_transaction(
                self.session_factory,
                attempt,
                max_attempts=1_000_000,  # the deadline ends it
                initial_wait=0.01,
                max_wait=0.32,
                on_retry=on_retry,
                deadline=deadline,
            )
        except RetriesExhaustedError as exc:
            if (final := classify(exc.__cause__ or exc)) is not None:
                failures[final.kind.value] += 1
            return NOT_STARTED | {"attempts": exc.attempts, "failures": dict(failures)}
        except Exception as exc:
            if not keep_going:
                raise
            failures[type(exc).__name__] += 1
            return NOT_STARTED | {"attempts": sum(failures.values()), "failures": dict(failures)}
        committed_at = time.time()
        latency, statements = time.monotonic() - start, self.statements
        subtransactions = {"savepoints": self.savepoints - savepoints}
        subtransactions["rollbacks_to"] = self.rollbacks_to - rollbacks_to
        for callback in callbacks:  # Airflow's, after the COMMIT that succeeded
            callback()
        done: dict[str, Any] = {"ok": True, "latency_s": latency, "attempts": sum(failures.values()) + 1}
        done |= {"failures": dict(failures), "statements": statements, **subtransactions}
        return done | {"committed_at": committed_at}


#: This process's worker (set by :func:`setup`).
_worker: _Worker


def setup(manager: str, index: int, barrier: Any) -> None:
    """Import Airflow, check that it resolved ``manager``'s class, and make this process's worker."""
    import airflow
    import airflow.models.taskinstance as taskinstance_module
    from airflow.assets import manager as airflow_manager

    global _worker
    resolved, expected = airflow_manager.asset_manager, pkgutil.resolve_name(MANAGER_CLASSES[manager])
    name = f"{type(resolved).__module__}.{type(resolved).__qualname__}"
    # The same instance must be the one TaskInstance.register_asset_changes_in_db calls.
    if type(resolved) is not expected or vars(taskinstance_module)["asset_manager"] is not resolved:
        raise RuntimeError(f"{manager}: Airflow resolved {name} (in airflow.models.taskinstance too?)")
    found = {"manager": manager, "class": name, "airflow": str(airflow.__version__), "pid": os.getpid()}
    _worker = _Worker(index, barrier, found | {"hash_seed": os.environ.get("PYTHONHASHSEED")})


def info() -> dict[str, Any]:
    """The class this process resolved, its Airflow version, pid and hash seed."""
    return _worker.info


def target(url: str, pg_deadlock_timeout_ms: int | None = None) -> None:
    """Point Airflow's ORM at ``url``, counting statements (and setting ``deadlock_timeout``)."""
    import sqlalchemy as sa

    engine = _worker.point_at(url)
    sa.event.listen(engine, "before_cursor_execute", _worker.count)
    if pg_deadlock_timeout_ms is not None and engine.dialect.name == "postgresql":

        def _deadlock_timeout(dbapi_connection: Any, _record: Any) -> None:
            # Needs superuser; transactional in PostgreSQL, so commit it.
            with dbapi_connection.cursor() as cursor:
                cursor.execute(f"SET deadlock_timeout = '{int(pg_deadlock_timeout_ms)}ms'")
            dbapi_connection.commit()

        sa.event.listen(engine, "connect", _deadlock_timeout)


def release() -> None:
    """Dispose of Airflow's engine (before the scratch database is dropped)."""
    _worker.release()


def seed(dag_ids: list[str], assets: dict[str, int]) -> dict[str, int]:
    """Bundle, DAGs (unpaused, not partitioned), active assets; ``assets[name]`` = its fan-out."""
    from airflow.models.asset import AssetActive, AssetModel, DagScheduleAssetReference
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel

    with _worker.session_factory() as session:
        session.add(DagBundleModel(name=BUNDLE))
        session.flush()  # dag.bundle_name has an FK but no relationship to order the inserts
        flags = {"bundle_name": BUNDLE, "is_paused": False, "is_stale": False, "timetable_partitioned": False}
        session.add_all(DagModel(dag_id=dag_id, **flags) for dag_id in [PRODUCER_DAG, *dag_ids])
        models = {name: AssetModel(name=name, uri=asset_uri(name), group="asset") for name in assets}
        session.add_all(models.values())
        session.flush()
        ids: dict[str, int] = {name: model.id for name, model in models.items()}
        for name, fanout in assets.items():
            session.add(AssetActive.for_asset(models[name]))
            session.add_all(DagScheduleAssetReference(asset_id=ids[name], dag_id=d) for d in dag_ids[:fanout])
        session.commit()
    return ids


def sweep_call(asset: str, run_id: str) -> dict[str, Any]:
    """One ``asset_manager.register_asset_change`` + COMMIT, timed; no retry (one caller)."""
    from airflow.assets.manager import asset_manager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

    key = SerializedAssetUniqueKey(name=asset, uri=asset_uri(asset))
    ti: Any = _task_instance(f"sweep{_worker.index}", run_id)
    with _worker.session_factory() as session:
        _worker.statements = 0
        start = time.perf_counter()
        event = asset_manager.register_asset_change(task_instance=ti, asset=key, session=session)
        session.commit()
        latency, statements = time.perf_counter() - start, _worker.statements
    return {"latency_s": latency, "statements": statements, "event": event is not None}


def warmup(assets: list[str], run_id: str) -> bool:
    """One committed transaction (mappers, statement caches, the connection); whether it committed."""
    return bool(_worker.transaction(assets, run_id, 0.0, time.monotonic() + 60)["ok"])


def round_of(
    assets: list[str],
    run_prefix: str,
    transactions: int,
    hold_s: float,
    budget_s: float,
    own_asset: bool = False,
    keep_going: bool = False,
    pace_s: float = 0.0,
) -> dict[str, Any]:
    """Wait for the manager's other producers, then run ``transactions`` transactions until ``budget_s``
    (those not started by then: 0 attempts); with ``own_asset``, producer ``i`` emits ``{asset}_p{i}``.
    ``keep_going``: :meth:`_Worker.transaction`'s; each transaction's ``run_id`` is in its result.
    ``pace_s``: a sustained rate, the same whatever the manager: a producer starts its ``n``-th transaction
    no earlier than ``(n + i / producers) * pace_s`` into the round (producer ``i``; spread, not in step)."""
    if own_asset:
        assets = [f"{asset}_p{_worker.index}" for asset in assets]
    _worker.barrier.wait(timeout=120)
    start = time.monotonic()
    deadline = start + budget_s
    run_ids = [f"{run_prefix}p{_worker.index}-t{n}" for n in range(transactions)]
    offset = _worker.index / _worker.barrier.parties
    txs = []
    for n, run_id in enumerate(run_ids):
        if pace_s:
            time.sleep(max(0.0, start + (n + offset) * pace_s - time.monotonic()))
        started = time.monotonic() <= deadline
        tx = _worker.transaction(assets, run_id, hold_s, deadline, keep_going) if started else NOT_STARTED
        txs.append(tx | {"run_id": run_id})
    return {"start": start, "end": time.monotonic(), "transactions": txs}


def _task_instance(task_id: str, run_id: str) -> SimpleNamespace:
    """A stand-in for the producing TaskInstance: the attributes Airflow 3.3.2 reads on this path."""
    ids = {"dag_id": PRODUCER_DAG, "task_id": task_id, "run_id": run_id, "map_index": -1, "try_number": 1}
    # Airflow 3.4 records the task instance's id on the event and reads its map index off its dynamic
    # region (the sentinel: no region); earlier lines read neither.
    region = {"id": uuid.uuid4(), "region_id": uuid.UUID(int=0), "region_index": -1}
    dag_run = SimpleNamespace(partition_key=None, partition_date=None)
    log = logging.getLogger("airflow_adrq_bench.airflow_mode.ti")
    return SimpleNamespace(**ids, **region, log=log, dag_run=dag_run)


class Workers:
    """The worker processes: ``producers`` per manager, each bound to its manager for life."""

    def __init__(self, managers: Sequence[str], producers: int, home: Path, step: Callable[[], None]) -> None:
        """Start them (``step()`` after each has imported Airflow); :class:`BenchError` if one fails."""
        # A barrier per manager, inherited by its producers at their start.
        barriers = {manager: SPAWN.Barrier(producers) for manager in managers}
        base = airflow_settings(home, f"sqlite:///{home}/unused.db")
        #: Per (manager, index) its process; ``info``: what each resolved (:func:`info`).
        self.procs: dict[tuple[str, int], Child] = {}
        self.info: list[dict[str, Any]] = []
        try:
            for index, manager in itertools.product(range(producers), managers):
                settings = base | {"AIRFLOW__CORE__ASSET_MANAGER_CLASS": MANAGER_CLASSES[manager]}
                if manager in MANAGER_KWARGS:
                    settings |= {"AIRFLOW__CORE__ASSET_MANAGER_KWARGS": MANAGER_KWARGS[manager]}
                seed = {"PYTHONHASHSEED": str(1000 + index)}
                label, args = f"worker {manager}/{index}", (manager, index, barriers[manager])
                self.procs[(manager, index)] = Child(label, settings, setup, *args, spawn_env=seed)
            for proc in self.procs.values():
                proc.started()
                self.info.append(proc.call(info))
                step()
        except BaseException:
            close_all(self.procs.values())
            raise

    def group(self, manager: str) -> list[Child]:
        return [p for (m, _), p in sorted(self.procs.items()) if m == manager]

    def broadcast(
        self, procs: Sequence[Child], function: Any, timeout: float = 600, **kwargs: Any
    ) -> list[Any]:
        """Start ``function(**kwargs)`` in every one of ``procs`` first, then collect the answers."""
        futures = [proc.submit(function, **kwargs) for proc in procs]
        return [proc.result(future, timeout) for proc, future in zip(procs, futures, strict=True)]
