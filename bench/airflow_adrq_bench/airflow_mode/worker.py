"""The producers of the Airflow modes: processes each bound to one asset manager, and their pool.

Per producer index :class:`Workers` spawns one *zygote* with its own
``PYTHONHASHSEED`` (Airflow iterates a task's outlets as a ``set``; processes
differ in that order, as API-server workers do). It runs ``import airflow``
(about 3 s of CPU) once and forks one worker per manager. ``import airflow``
does not import ``airflow.assets.manager``, where ``[core]
asset_manager_class`` is read: each worker sets it to its manager's class
first, then checks that ``asset_manager`` is exactly that class. Its commands
(:func:`.processes.serve`): ``target``, ``seed`` (with Airflow's models),
``sweep_call`` (one ``register_asset_change`` + COMMIT, timed), ``warmup``,
``round`` (producer transactions through
``TaskInstance.register_asset_changes_in_db``, after the manager's barrier),
``release``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES
from airflow_adrq_bench.airflow_mode.processes import (
    START_TIMEOUT,
    AirflowOrm,
    Child,
    Setup,
    airflow_settings,
    apply_environment,
    end,
    serve,
)

__all__ = ["BUNDLE", "PRODUCER_DAG", "Producer", "Workers", "asset_uri", "main", "zygote"]

#: The DAG bundle, and the producing DAG the task-instance stand-ins belong to.
BUNDLE = "adrq-bench-bundle"
PRODUCER_DAG = "adrq_bench_producer"


def asset_uri(name: str) -> str:
    return f"s3://adrq-bench/{name}"


class _Counter:
    """Statements this process sent since the last reset (cursor executes; executemany per set)."""

    value = 0

    def __call__(
        self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        if statement.lstrip()[:5].upper() != "BEGIN":
            self.value += len(parameters) if executemany and parameters else 1


def _tx(
    ok: bool, latency: float | None, attempts: int, failures: Counter[str], statements: int
) -> dict[str, Any]:
    return {
        "ok": ok,
        "latency_s": latency,
        "attempts": attempts,
        "failures": dict(failures),
        "statements": statements,
    }


class _Worker(AirflowOrm):
    def __init__(self, index: int, barrier: Any) -> None:
        self.index = index
        self.barrier = barrier
        self.statements = _Counter()

    def target(self, url: str, pg_deadlock_timeout_ms: int | None = None) -> dict[str, Any]:
        """Point Airflow's ORM at ``url``, counting statements (and setting ``deadlock_timeout``)."""
        import sqlalchemy as sa

        engine = self.point_at(url)
        sa.event.listen(engine, "before_cursor_execute", self.statements)
        if pg_deadlock_timeout_ms is not None and engine.dialect.name == "postgresql":

            def _deadlock_timeout(dbapi_connection: Any, _record: Any) -> None:
                # Needs superuser; transactional in PostgreSQL, so commit it.
                cursor = dbapi_connection.cursor()
                cursor.execute(f"SET deadlock_timeout = '{int(pg_deadlock_timeout_ms)}ms'")
                cursor.close()
                dbapi_connection.commit()

            sa.event.listen(engine, "connect", _deadlock_timeout)
        return {"dialect": engine.dialect.name, "driver": engine.dialect.driver}

    def seed(self, dag_ids: list[str], assets: dict[str, int]) -> dict[str, int]:
        """Bundle, DAGs (unpaused, not partitioned), active assets; ``assets[name]`` = its fan-out."""
        from airflow.models.asset import AssetActive, AssetModel, DagScheduleAssetReference
        from airflow.models.dag import DagModel
        from airflow.models.dagbundle import DagBundleModel

        ids: dict[str, int] = {}
        with self.session_factory() as session:
            session.add(DagBundleModel(name=BUNDLE))
            session.flush()  # dag.bundle_name has an FK but no relationship to order the inserts
            for dag_id in [PRODUCER_DAG, *dag_ids]:
                session.add(
                    DagModel(
                        dag_id=dag_id,
                        bundle_name=BUNDLE,
                        is_paused=False,
                        is_stale=False,
                        timetable_partitioned=False,
                    )
                )
            session.flush()
            for name, fanout in assets.items():
                model = AssetModel(name=name, uri=asset_uri(name), group="asset")
                session.add(model)
                session.flush()
                ids[name] = model.id
                session.add(AssetActive.for_asset(model))
                for dag_id in dag_ids[:fanout]:
                    session.add(DagScheduleAssetReference(asset_id=model.id, dag_id=dag_id))
            session.commit()
        return ids

    def sweep_call(self, asset: str, run_id: str) -> dict[str, Any]:
        """One ``asset_manager.register_asset_change`` + COMMIT, timed; no retry (one caller)."""
        from airflow.assets import manager as airflow_manager
        from airflow.serialization.definitions.assets import SerializedAssetUniqueKey

        key = SerializedAssetUniqueKey(name=asset, uri=asset_uri(asset))
        # A stand-in task instance (the fields Airflow reads), not an ORM one.
        ti: Any = _task_instance(f"sweep{self.index}", run_id)
        with self.session_factory() as session:
            self.statements.value = 0
            start = time.perf_counter()
            event = airflow_manager.asset_manager.register_asset_change(
                task_instance=ti, asset=key, session=session
            )
            session.commit()
            latency, statements = time.perf_counter() - start, self.statements.value
        return {"latency_s": latency, "statements": statements, "event": event is not None}

    def warmup(self, assets: list[str], run_id: str) -> dict[str, Any]:
        """One committed multi-outlet transaction (mappers, statement caches, the connection)."""
        result = self._transaction(assets, run_id, hold_s=0.0, deadline=time.monotonic() + 60)
        return {"ok": result["ok"], "failures": result["failures"]}

    def round(
        self,
        assets: list[str],
        run_prefix: str,
        transactions: int,
        hold_s: float,
        budget_s: float,
        barrier_timeout_s: float,
    ) -> dict[str, Any]:
        """Wait for the other producers, then run ``transactions`` transactions (replayed on deadlock)."""
        self.barrier.wait(timeout=barrier_timeout_s)
        start = time.monotonic()
        deadline = start + budget_s
        txs = [
            self._transaction(assets, f"{run_prefix}p{self.index}-t{n}", hold_s, deadline)
            if time.monotonic() <= deadline
            else _tx(False, None, 0, Counter(), 0)
            for n in range(transactions)
        ]
        return {"start": start, "end": time.monotonic(), "transactions": txs}

    def _transaction(self, assets: list[str], run_id: str, hold_s: float, deadline: float) -> dict[str, Any]:
        """Task success as Airflow's Execution API runs it: register the outlets, hold, COMMIT, callbacks.

        A retryable failure (deadlock, lock timeout, serialization failure,
        SQLite busy) rolls the whole transaction back and replays it after a
        jittered back-off (:func:`airflow_adrq.run_in_transaction`), until
        ``deadline``; anything else is raised. Airflow's callbacks run after
        the COMMIT that succeeded, outside the timing.
        """
        from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
        from airflow.models.taskinstance import TaskInstance

        from airflow_adrq.errors import RetriesExhaustedError
        from airflow_adrq.retry import Retryable, classify, run_in_transaction

        outlets = [AssetProfile(name=name, uri=asset_uri(name), type="Asset") for name in assets]
        ti: Any = _task_instance(f"t{self.index}", run_id)
        failures: Counter[str] = Counter()
        attempts = [0]

        def attempt(session: Any, _sink: list[Any]) -> Any:
            attempts[0] += 1
            self.statements.value = 0
            callbacks = TaskInstance.register_asset_changes_in_db(ti, outlets, [], session=session)
            if hold_s:
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
            final = classify(exc.__cause__) if exc.__cause__ is not None else None
            if final is not None:
                failures[final.kind.value] += 1
            return _tx(False, None, attempts[0], failures, 0)
        latency, statements = time.monotonic() - start, self.statements.value
        for callback in callbacks:  # Airflow's, after the COMMIT that succeeded
            callback()
        return _tx(True, latency, attempts[0], failures, statements)


def _task_instance(task_id: str, run_id: str) -> SimpleNamespace:
    """A stand-in for the producing TaskInstance: the attributes Airflow 3.3.2 reads on this path."""
    return SimpleNamespace(
        dag_id=PRODUCER_DAG,
        task_id=task_id,
        run_id=run_id,
        map_index=-1,
        try_number=1,
        dag_run=SimpleNamespace(partition_key=None, partition_date=None),
        log=logging.getLogger("airflow_adrq_bench.airflow_mode.ti"),
        # Airflow 3.4 records the task instance's id on the event and reads its
        # map index off its dynamic region (the sentinel: no region); earlier
        # lines read neither.
        id=uuid.uuid4(),
        region_id=uuid.UUID(int=0),
        region_index=-1,
    )


def _check_manager(manager: str) -> dict[str, Any]:
    """The manager Airflow resolved from ``[core] asset_manager_class`` must be this worker's."""
    import airflow
    import airflow.models.taskinstance as taskinstance_module
    from airflow.assets import manager as airflow_manager

    resolved = airflow_manager.asset_manager
    expected: type = airflow_manager.AssetManager
    if manager == "plugin":
        from airflow_adrq.airflow import AdrqAssetManager

        expected = AdrqAssetManager
    elif manager == "sorted_loop":
        from airflow_adrq_bench.airflow_mode.sorted_loop import SortedLoopAssetManager

        expected = SortedLoopAssetManager
    name = f"{type(resolved).__module__}.{type(resolved).__qualname__}"
    if type(resolved) is not expected:
        raise RuntimeError(
            f"{manager}: airflow.assets.manager.asset_manager is {name}, "
            f"expected {expected.__module__}.{expected.__qualname__}"
        )
    # The same instance is the one TaskInstance.register_asset_changes_in_db calls.
    airflow_ti: Any = taskinstance_module
    if airflow_ti.asset_manager is not resolved:
        raise RuntimeError(f"{manager}: airflow.models.taskinstance uses another asset manager")
    hash_seed = os.environ.get("PYTHONHASHSEED")
    return {
        "manager": manager,
        "class": name,
        "airflow": str(airflow.__version__),
        "pid": os.getpid(),
        "hash_seed": hash_seed,
    }


def zygote(index: int, env: dict[str, str], seats: list[tuple[str, Any, Any, dict[str, str]]]) -> None:
    """Import Airflow once, then fork one worker per ``(manager, conn, barrier, env)`` seat and wait."""

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    apply_environment(env)
    try:
        import airflow  # noqa: F401  (settings, logging, ORM set-up; not airflow.assets.manager)
    except BaseException:
        for _, conn, _, _ in seats:
            conn.send(("error", traceback.format_exc()))
        return
    fork = multiprocessing.get_context("fork")
    children = []
    for manager, conn, barrier, worker_env in seats:
        child = fork.Process(
            target=main,
            args=(conn, barrier, manager, index, worker_env),
            name=f"adrq-airflow-{manager}-{index}",
        )
        child.daemon = True
        child.start()
        children.append(child)
    for _, conn, _, _ in seats:
        conn.close()  # the workers hold them now: a worker's exit is an EOF for the controller
    for child in children:
        child.join()


def main(conn: Any, barrier: Any, manager: str, index: int, env: dict[str, str]) -> None:
    """Worker entry point: configure Airflow for ``manager``, then serve commands until ``close``."""

    def setup() -> Setup:
        info = _check_manager(manager)
        worker = _Worker(index, barrier)
        commands: dict[str, Callable[..., Any]] = {
            "target": worker.target,
            "release": worker.release,
            "seed": worker.seed,
            "sweep_call": worker.sweep_call,
            "warmup": worker.warmup,
            "round": worker.round,
        }
        return info, commands, worker.release

    serve(conn, env, setup)


@dataclass
class Producer(Child):
    """The controller's handle on one worker (:class:`.processes.Child`; ``process`` is its zygote)."""

    manager: str = ""
    index: int = 0


class Workers:
    """The worker processes: ``producers`` per manager, each bound to its manager for life.

    One spawned zygote per producer index (its own hash seed) imports Airflow
    and forks that index's worker of every manager.
    """

    def __init__(self, managers: Sequence[str], producers: int, home: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.procs: dict[tuple[str, int], Producer] = {}
        self.zygotes: list[Any] = []
        self.closed = False
        # Kept for the processes' lifetime: a barrier collected in this process
        # is gone before a child that has not started yet can attach to it.
        self.barriers = {manager: ctx.Barrier(producers) for manager in managers}
        base = airflow_settings(home, f"sqlite:///{home}/unused.db")
        saved = os.environ.get("PYTHONHASHSEED")
        try:
            for index in range(producers):
                seats, ends = [], []
                for manager in managers:
                    env = dict(base)
                    class_path = MANAGER_CLASSES[manager]
                    if class_path:
                        env["AIRFLOW__CORE__ASSET_MANAGER_CLASS"] = class_path
                    parent, child = ctx.Pipe()
                    seats.append((manager, child, self.barriers[manager], env))
                    ends.append((manager, parent, child))
                # A hash seed per producer: Airflow iterates a task's outlets as a
                # set, and production processes differ in that order.
                os.environ["PYTHONHASHSEED"] = str(1000 + index)
                process = ctx.Process(target=zygote, args=(index, base, seats), name=f"adrq-airflow-{index}")
                process.start()
                self.zygotes.append(process)
                for manager, parent, child in ends:
                    child.close()
                    self.procs[(manager, index)] = Producer(
                        f"worker {manager}/{index}", parent, process, {}, manager, index
                    )
        finally:
            if saved is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = saved
        try:
            for proc in self.procs.values():
                proc.info = proc.receive(START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def group(self, manager: str) -> list[Producer]:
        return [p for (m, _), p in sorted(self.procs.items()) if m == manager]

    def broadcast(
        self, procs: Sequence[Producer], name: str, timeout: float = 600, **kwargs: Any
    ) -> list[Any]:
        """Send ``name`` to every one of ``procs`` first, then collect their answers (they run at once)."""
        for proc in procs:
            proc.send(name, **kwargs)
        return [proc.receive(timeout) for proc in procs]

    def close(self) -> None:
        """Ask every worker to exit; kill (by pid) the workers that do not answer, then the zygotes."""
        if self.closed:
            return
        self.closed = True
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.send("close")
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            if not proc.closed_by(deadline) and proc.info.get("pid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.info["pid"], signal.SIGKILL)
        for process in self.zygotes:
            end(process, deadline)
