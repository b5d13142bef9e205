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
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while time.monotonic() < deadline and alive():
            # InnoDB serves its lock tables from a cache refreshed only when it was
            # not read for 0.1 s: a read right after another may show a wait that is
            # over (between connections the pool hands out again).
            time.sleep(0.15)
            found = waiter and waiter[0] is not None
            if found and conn.execute(query, {"waiter": waiter[0], "blocker": blocker}).scalar():
                return True
            conn.rollback()
    return False
