"""Who waits for whom, read off the server's lock tables: for tests that force an interleaving."""

from __future__ import annotations

import time

import sqlalchemy as sa


def backend_id(conn: sa.Connection) -> object:
    """The server's id of ``conn``'s session (``pg_backend_pid()``, ``CONNECTION_ID()``)."""
    query = "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    return conn.exec_driver_sql(query).scalar_one()


def blocked_by(engine: sa.Engine, waiter: list, blocker: object, alive=lambda: True, timeout=20.0) -> bool:
    """Poll until session ``waiter[0]`` waits for a lock session ``blocker`` holds (not a sleep).

    ``waiter`` is a list the waiting thread fills in once it knows its id.
    False if ``alive()`` turns false or ``timeout`` passes first.
    """
    if engine.dialect.name == "postgresql":
        query = sa.text("SELECT CAST(:blocker AS int) = ANY(pg_blocking_pids(:waiter))")
    else:
        query = sa.text(
            "SELECT count(*) > 0 FROM information_schema.innodb_lock_waits w "
            "JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id "
            "JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id "
            "WHERE r.trx_mysql_thread_id = :waiter AND b.trx_mysql_thread_id = :blocker"
        )
    # InnoDB serves its lock tables from one server-wide cache, refreshed by a
    # read only when nobody read it for 0.1 s (trx_i_s_cache): a read right
    # after another may show a wait that is over, and pollers that read more
    # often than that between them (two pytest-xdist workers at 0.15 s each)
    # can keep it from being refreshed at all. At 0.25 s, two pollers leave a
    # gap of at least 0.125 s every round. PostgreSQL's pg_blocking_pids is live.
    pause = 0.05 if engine.dialect.name == "postgresql" else 0.25
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while time.monotonic() < deadline and alive():
            time.sleep(pause)
            found = waiter and waiter[0] is not None
            if found and conn.execute(query, {"waiter": waiter[0], "blocker": blocker}).scalar():
                return True
            conn.rollback()
    return False
