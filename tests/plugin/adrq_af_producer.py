# mypy: ignore-errors
"""One producer process of the concurrency test (started with multiprocessing "spawn").

Each round: all producers wait at a barrier, producer 0 empties the queue,
they wait again, then every producer runs ONE task-success-like transaction:
``TaskInstance.register_asset_changes_in_db`` with several outlets through
the manager under test, a short hold (the rest of ``ti_update_state``), and
COMMIT. A deadlock (PostgreSQL 40P01) is counted and the whole transaction is
replayed, so every round ends with exactly one committed transaction per
producer.
"""

from __future__ import annotations

import os
import random
import sys
import time


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


def run(index, url, variants, rounds, outlet_names, hold_seconds, barrier, results):
    import airflow.models.taskinstance as airflow_ti
    import sqlalchemy as sa
    from airflow.assets.manager import AssetManager
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.orm_event_handlers import setup_event_handlers
    from sqlalchemy.orm import Session

    from airflow_adrq.airflow import AdrqAssetManager
    from tests.plugin.adrq_af_scenario import outlet, task_instance

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
    managers = {"stock": AssetManager, "adrq": AdrqAssetManager}
    outlets = [outlet(name) for name in outlet_names]
    # Warm up (mapper configuration, statement compilation, first connection)
    # outside the measured rounds, so that the producers really overlap.
    sa.orm.configure_mappers()
    # Rolled back; a deadlock between warm-ups does not matter.
    try:
        with Session(engine) as session:
            TaskInstance.register_asset_changes_in_db(task_instance("warm-up"), outlets, [], session=session)
            session.rollback()
    except Exception as exc:
        if not _is_deadlock(exc):
            raise
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
            attempt = 0
            while True:
                start = time.monotonic()
                try:
                    with Session(engine) as session:
                        TaskInstance.register_asset_changes_in_db(ti, outlets, [], session=session)
                        time.sleep(hold_seconds)
                        session.commit()
                    worst = max(worst, time.monotonic() - start)
                    break
                except Exception as exc:
                    if not _is_deadlock(exc):
                        raise
                    deadlocks += 1
                    attempt += 1
                    # Jittered exponential back-off before the replay, or the victims keep meeting again.
                    time.sleep(random.uniform(0, 0.01 * 2 ** min(attempt, 5)))
            if os.environ.get("ADRQ_AF_TRACE"):
                print(f"{variant} producer {index} round {round_no}: {deadlocks} deadlocks", file=sys.stderr)
        results.put((variant, index, deadlocks, worst))
    engine.dispose()
