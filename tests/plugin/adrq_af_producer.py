"""Producer processes of the concurrency tests (started with multiprocessing "spawn").

A producer runs task-success-like transactions through Airflow's own code:
``TaskInstance.register_asset_changes_in_db`` with several outlets through the
manager under test, a short hold (the rest of ``ti_update_state``), and
COMMIT. A deadlock (PostgreSQL 40P01, MySQL/MariaDB 1213) is counted and the
whole transaction is replayed, so every transaction ends committed.

:func:`run` (the throughput run): each round, all producers wait at a
barrier, producer 0 empties the queue, they wait again, then every producer
runs ONE transaction; the interleaving is left to the machine.

:func:`run_forced` (the negative control): two producers, and the
interleaving is forced. Each producer's outlets name the same two assets in
opposite orders, by outlet kind: Airflow registers a task's ``Asset`` outlets
before its ``Asset.ref(name=...)`` outlets (``register_asset_changes_in_db``
on 3.1 to 3.4), so producer 0 registers ``a0`` then ``a1`` and producer 1
``a1`` then ``a0``, whatever the hash seeds. The manager is wrapped so that,
on a transaction's first attempt, each producer waits at a barrier after its
first ``register_asset_change`` has returned: by then stock Airflow has
inserted (and locked) that asset's queue rows, so both then ask for the
other's rows and the server must report a deadlock. The wrapper records the
order of the calls, for the test to check that the orders were opposite.
"""

from __future__ import annotations

import os
import random
import sys
import time

#: Seconds a producer waits at the forced run's pause (both have registered their first asset).
PAUSE_TIMEOUT = 60
#: Seconds a producer waits at the forced run's step barrier (with the test process); the
#: first wait covers the other producer's start (importing Airflow on a loaded 2-core machine).
STEP_TIMEOUT = 300


# PostgreSQL SQLSTATE 40P01; MySQL/MariaDB errno 1213. On MariaDB a deadlock
# inside Airflow's SAVEPOINT path surfaces as 1305 "SAVEPOINT ... does not
# exist", with 1213 further down the chain: walk the whole chain.
def _is_deadlock(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for candidate in (exc, getattr(exc, "orig", None)):
            if getattr(candidate, "pgcode", None) == "40P01":
                return True
            args = getattr(candidate, "args", ())
            if args and args[0] == 1213:
                return True
        exc = exc.__cause__ or exc.__context__
    return False


def _engine(url):
    import sqlalchemy as sa
    from airflow.utils.orm_event_handlers import setup_event_handlers

    kwargs = {"isolation_level": "READ COMMITTED"} if url.startswith("mysql") else {}
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, **kwargs)
    setup_event_handlers(engine)

    def _fast_deadlock_detection(dbapi_connection, _record):
        # Each detected deadlock otherwise costs deadlock_timeout (1 s); needs superuser.
        # SET is transactional in PostgreSQL: commit it, or the pool's reset rolls it back.
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET deadlock_timeout = '50ms'")
            dbapi_connection.commit()
        except Exception:
            dbapi_connection.rollback()
        cursor.close()

    if engine.dialect.name == "postgresql":
        sa.event.listen(engine, "connect", _fast_deadlock_detection)
    return engine


def _outlets(specs):
    """Outlet profiles from asset names, or ``(name, kind)`` pairs (kind as adrq_af_scenario.outlet's)."""
    from tests.plugin.adrq_af_scenario import outlet

    return [outlet(spec) if isinstance(spec, str) else outlet(spec[0], kind=spec[1]) for spec in specs]


def _managers():
    from airflow.assets.manager import AssetManager

    from airflow_adrq.airflow import AdrqAssetManager

    return {"stock": AssetManager, "adrq": AdrqAssetManager}


def _warm_up(engine, outlets):
    """Mapper configuration, statement compilation, first connection: outside the measured rounds."""
    import sqlalchemy as sa
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session

    from tests.plugin.adrq_af_scenario import task_instance

    sa.orm.configure_mappers()
    # Rolled back; a deadlock between warm-ups does not matter.
    try:
        with Session(engine) as session:
            TaskInstance.register_asset_changes_in_db(task_instance("warm-up"), outlets, [], session=session)
            session.rollback()
    except Exception as exc:
        if not _is_deadlock(exc):
            raise


def _commit_one(engine, ti, outlets, hold_seconds, before_attempt=None):
    """One transaction, replayed after each deadlock until it commits: (deadlocks, last attempt seconds)."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session

    deadlocks = 0
    while True:
        if before_attempt is not None:
            before_attempt()
        start = time.monotonic()
        try:
            with Session(engine) as session:
                TaskInstance.register_asset_changes_in_db(ti, outlets, [], session=session)
                time.sleep(hold_seconds)
                session.commit()
            return deadlocks, time.monotonic() - start
        except Exception as exc:
            if not _is_deadlock(exc):
                raise
            deadlocks += 1
            # Jittered exponential back-off before the replay, or the victims keep meeting again.
            time.sleep(random.uniform(0, 0.01 * 2 ** min(deadlocks, 5)))


def run(index, url, variants, rounds, outlet_names, hold_seconds, barrier, results):
    """The throughput run; puts ``(variant, index, deadlocks, worst seconds)`` per variant."""
    import airflow.models.taskinstance as airflow_ti

    from tests.plugin.adrq_af_scenario import task_instance

    engine = _engine(url)
    managers = _managers()
    outlets = _outlets(outlet_names)
    # Warm up outside the measured rounds, so that the producers really overlap.
    _warm_up(engine, outlets)
    for variant in variants:
        airflow_ti.asset_manager = managers[variant]()
        deadlocks = 0
        worst = 0.0
        for round_no in range(rounds):
            barrier.wait(timeout=60)
            if index == 0:
                with engine.begin() as conn:
                    conn.exec_driver_sql("DELETE FROM asset_dag_run_queue")
            barrier.wait(timeout=60)
            ti = task_instance(f"t{index}", f"{variant}-{round_no}")
            found, seconds = _commit_one(engine, ti, outlets, hold_seconds)
            deadlocks += found
            worst = max(worst, seconds)
            if os.environ.get("ADRQ_AF_TRACE"):
                print(f"{variant} producer {index} round {round_no}: {deadlocks} deadlocks", file=sys.stderr)
        results.put((variant, index, deadlocks, worst))
    engine.dispose()


class _PausingManager:
    """The manager under test, unchanged, pausing once after the first asset of a transaction.

    Airflow's ``register_asset_changes_in_db`` calls the module-level
    ``asset_manager``'s ``register_asset_change`` once per outlet asset; this
    stands in for it, records the asset of every call (before the call, so a
    call that deadlocks is recorded too) and, on the transaction's first
    attempt only, waits at ``pause`` once the first call has returned. A
    replay after a deadlock does not pause: the other producer is past it.
    """

    def __init__(self, manager, pause):
        self._manager = manager
        self._pause = pause
        #: The assets registered by each attempt, in call order.
        self.attempts: list[list[str]] = []

    def __getattr__(self, name):
        return getattr(self._manager, name)

    def begin_attempt(self):
        self.attempts.append([])

    def register_asset_change(self, *args, **kwargs):
        calls = self.attempts[-1]
        calls.append(getattr(kwargs.get("asset"), "name", None))
        result = self._manager.register_asset_change(*args, **kwargs)
        if len(self.attempts) == 1 and len(calls) == 1:
            self._pause.wait(timeout=PAUSE_TIMEOUT)
        return result


def run_forced(index, url, variants, rounds, outlet_specs, hold_seconds, step, pause, results):
    """The forced run: one transaction per round between two ``step`` waits (with the test process).

    The test empties the queue before the first wait of a round and reads the
    rows after the second. Before the second, puts ``{"variant", "round",
    "index", "deadlocks", "attempts"}`` (``attempts``: the assets each
    attempt registered, in order).
    """
    import airflow.models.taskinstance as airflow_ti

    from tests.plugin.adrq_af_scenario import task_instance

    engine = _engine(url)
    managers = _managers()
    outlets = _outlets(outlet_specs)
    _warm_up(engine, outlets)
    for variant in variants:
        instance = managers[variant]()
        for round_no in range(rounds):
            manager = _PausingManager(instance, pause)
            airflow_ti.asset_manager = manager
            step.wait(timeout=STEP_TIMEOUT)
            ti = task_instance(f"t{index}", f"{variant}-{round_no}")
            deadlocks, _ = _commit_one(
                engine, ti, outlets, hold_seconds, before_attempt=manager.begin_attempt
            )
            results.put(
                {
                    "variant": variant,
                    "round": round_no,
                    "index": index,
                    "deadlocks": deadlocks,
                    "attempts": manager.attempts,
                }
            )
            step.wait(timeout=STEP_TIMEOUT)
    engine.dispose()
