"""The Airflow processes of the Airflow mode: producers, each bound to one asset manager.

Per producer index the controller spawns one *zygote* (:func:`zygote`) with
its own ``PYTHONHASHSEED`` (Airflow iterates a task's outlets as a Python
``set``, so processes differ in that order, as API-server workers do). The
zygote replaces every ``AIRFLOW_*`` variable with the run's own (a private
``AIRFLOW_HOME``, no ``[core] asset_manager_class``), runs ``import
airflow`` (about 3 s of CPU, the bulk of a worker's start-up), and forks one
worker per manager (:func:`main`). Airflow reads ``[core]
asset_manager_class`` only when ``airflow.assets.manager`` is imported, which
``import airflow`` does not do: each worker first sets
``AIRFLOW__CORE__ASSET_MANAGER_CLASS`` to its manager's class (unset for
``stock``), then imports it and checks that
``airflow.assets.manager.asset_manager`` is an instance of exactly that class.

A worker then answers commands from the controller over a pipe, one at a
time: ``target`` points Airflow's own ORM (``airflow.settings.reconfigure_orm``:
Airflow's engine arguments, event handlers and session maker) at a scratch
database; ``seed`` writes DAGs, assets and references with Airflow's models;
``sweep_call`` times one ``register_asset_change`` + COMMIT; ``warmup``
commits one multi-outlet transaction; ``round`` waits at the manager's
barrier and runs producer transactions through
``TaskInstance.register_asset_changes_in_db``; ``release`` disposes the
engine; ``close`` exits. Every reply is ``("ok", result)`` or ``("error",
traceback)``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import signal
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

__all__ = ["BUNDLE", "PRODUCER_DAG", "asset_uri", "main", "zygote"]

#: The DAG bundle, and the producing DAG the task-instance stand-ins belong to.
BUNDLE = "adrq-bench-bundle"
PRODUCER_DAG = "adrq_bench_producer"


def asset_uri(name: str) -> str:
    return f"s3://adrq-bench/{name}"


class _Counter:
    """Statements this process sent since the last reset (cursor executes; executemany per set)."""

    def __init__(self) -> None:
        self.value = 0

    def reset(self) -> None:
        self.value = 0

    def __call__(
        self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        if statement.lstrip()[:5].upper() == "BEGIN":
            return
        self.value += len(parameters) if executemany and parameters else 1


class _Worker:
    def __init__(self, manager: str, index: int, barrier: Any) -> None:
        self.manager = manager
        self.index = index
        self.barrier = barrier
        self.statements = _Counter()
        self.session_factory: Any = None
        self.engine: Any = None

    # --- commands ---------------------------------------------------------

    def target(self, url: str, pg_deadlock_timeout_ms: int | None = None) -> dict[str, Any]:
        """Point Airflow's ORM at ``url`` (Airflow's own engine set-up)."""
        import sqlalchemy as sa
        from airflow import settings

        self.release()
        os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url
        settings.configure_vars()
        settings.reconfigure_orm()
        engine = settings.engine
        assert engine is not None, "settings.reconfigure_orm() made no engine"
        sa.event.listen(engine, "before_cursor_execute", self.statements)
        if pg_deadlock_timeout_ms is not None and engine.dialect.name == "postgresql":

            def _deadlock_timeout(dbapi_connection: Any, _record: Any) -> None:
                # Needs superuser; transactional in PostgreSQL, so commit it.
                cursor = dbapi_connection.cursor()
                cursor.execute(f"SET deadlock_timeout = '{int(pg_deadlock_timeout_ms)}ms'")
                cursor.close()
                dbapi_connection.commit()

            sa.event.listen(engine, "connect", _deadlock_timeout)
        self.engine = engine
        self.session_factory = settings.NonScopedSession
        return {"dialect": engine.dialect.name, "driver": engine.dialect.driver}

    def release(self) -> None:
        if self.engine is not None:
            from airflow import settings

            settings.dispose_orm(do_log=False)
            self.engine = None
            self.session_factory = None

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
        ti = _task_instance(f"sweep{self.index}", run_id)
        session = self.session_factory()
        try:
            self.statements.reset()
            start = time.perf_counter()
            # A stand-in task instance (the fields Airflow reads), not an ORM one.
            stand_in: Any = ti
            event = airflow_manager.asset_manager.register_asset_change(
                task_instance=stand_in, asset=key, session=session
            )
            session.commit()
            latency = time.perf_counter() - start
            statements = self.statements.value
        finally:
            session.close()
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
        txs: list[dict[str, Any]] = []
        for n in range(transactions):
            if time.monotonic() > deadline:
                txs.append({"ok": False, "latency_s": None, "attempts": 0, "failures": {}, "statements": 0})
                continue
            txs.append(self._transaction(assets, f"{run_prefix}p{self.index}-t{n}", hold_s, deadline))
        return {"start": start, "end": time.monotonic(), "transactions": txs}

    # --- one producer transaction --------------------------------------------

    def _transaction(self, assets: list[str], run_id: str, hold_s: float, deadline: float) -> dict[str, Any]:
        """Task success as Airflow's Execution API runs it: register the outlets, hold, COMMIT, callbacks.

        A retryable failure (deadlock, lock timeout, serialization failure,
        SQLite busy) rolls the whole transaction back and replays it after a
        jittered back-off, until ``deadline``; anything else is raised.
        """
        from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
        from airflow.models.taskinstance import TaskInstance

        from airflow_adrq.retry import classify

        outlets = [AssetProfile(name=name, uri=asset_uri(name), type="Asset") for name in assets]
        ti = _task_instance(f"t{self.index}", run_id)
        failures: Counter[str] = Counter()
        attempts = 0
        start = time.monotonic()
        while True:
            attempts += 1
            self.statements.reset()
            session = self.session_factory()
            try:
                stand_in: Any = ti
                callbacks: Any = TaskInstance.register_asset_changes_in_db(
                    stand_in, outlets, [], session=session
                )
                if hold_s:
                    time.sleep(hold_s)
                session.commit()
                latency = time.monotonic() - start
                statements = self.statements.value
            except Exception as exc:
                session.close()
                found = classify(exc)
                if found is None:
                    raise
                failures[found.kind.value] += 1
                if time.monotonic() > deadline:
                    return {
                        "ok": False,
                        "latency_s": None,
                        "attempts": attempts,
                        "failures": dict(failures),
                        "statements": 0,
                    }
                time.sleep(random.uniform(0, 0.01 * 2 ** min(attempts, 5)))
                continue
            session.close()
            for callback in callbacks:
                callback()
            return {
                "ok": True,
                "latency_s": latency,
                "attempts": attempts,
                "failures": dict(failures),
                "statements": statements,
            }


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


def _apply_environment(env: dict[str, str]) -> None:
    for name in [n for n in os.environ if n.startswith("AIRFLOW_")]:
        del os.environ[name]
    os.environ.update(env)


def _check_manager(manager: str) -> dict[str, Any]:
    """The manager Airflow resolved from ``[core] asset_manager_class`` must be this worker's."""
    import airflow
    from airflow.assets import manager as airflow_manager

    resolved = airflow_manager.asset_manager
    if manager == "plugin":
        from airflow_adrq.airflow import AdrqAssetManager

        expected: type = AdrqAssetManager
    elif manager == "sorted_loop":
        from airflow_adrq_bench.airflow_mode.sorted_loop import SortedLoopAssetManager

        expected = SortedLoopAssetManager
    else:
        expected = airflow_manager.AssetManager
    if type(resolved) is not expected:
        raise RuntimeError(
            f"{manager}: airflow.assets.manager.asset_manager is {type(resolved).__module__}."
            f"{type(resolved).__qualname__}, expected {expected.__module__}.{expected.__qualname__}"
        )
    # The same instance is the one TaskInstance.register_asset_changes_in_db calls.
    import airflow.models.taskinstance as taskinstance_module

    airflow_ti: Any = taskinstance_module
    if airflow_ti.asset_manager is not resolved:
        raise RuntimeError(f"{manager}: airflow.models.taskinstance uses another asset manager")
    return {
        "manager": manager,
        "class": f"{type(resolved).__module__}.{type(resolved).__qualname__}",
        "airflow": str(airflow.__version__),
        "pid": os.getpid(),
        "hash_seed": os.environ.get("PYTHONHASHSEED"),
    }


def zygote(index: int, env: dict[str, str], seats: list[tuple[str, Any, Any, dict[str, str]]]) -> None:
    """Import Airflow once, then fork one worker per ``(manager, conn, barrier, env)`` seat and wait."""
    # The controller stops the workers (Ctrl-C reaches the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _apply_environment(env)
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
            daemon=True,
        )
        child.start()
        children.append(child)
    for _, conn, _, _ in seats:
        conn.close()  # the workers hold them now: a worker's exit is an EOF for the controller
    for child in children:
        child.join()


def main(conn: Any, barrier: Any, manager: str, index: int, env: dict[str, str]) -> None:
    """Worker entry point: configure Airflow for ``manager``, then serve commands until ``close``."""
    _apply_environment(env)
    try:
        info = _check_manager(manager)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    worker = _Worker(manager, index, barrier)
    conn.send(("ok", info))
    commands: dict[str, Callable[..., Any]] = {
        "target": worker.target,
        "release": worker.release,
        "seed": worker.seed,
        "sweep_call": worker.sweep_call,
        "warmup": worker.warmup,
        "round": worker.round,
    }
    serve(conn, commands, close=worker.release)


def serve(conn: Any, commands: dict[str, Callable[..., Any]], *, close: Callable[[], Any]) -> None:
    """A child process's command loop: ``(name, kwargs)`` in, ``("ok", result)`` or ``("error", tb)`` out.

    ``close`` (or the controller's end of the pipe closing) ends it. The Airflow
    modes' producer workers and the accounting consumer both serve this way.
    """
    while True:
        try:
            name, kwargs = conn.recv()
        except EOFError:
            break
        if name == "close":
            close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", commands[name](**kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
