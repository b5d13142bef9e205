"""Whether a PostgreSQL connection goes through PgBouncer, and in which pool mode.

The server seeing this connection's own TCP ports rules it out. Otherwise at
most three more connections: PgBouncer's admin console (``SHOW`` only), then,
when it does not tell the pool mode, two that run ``SELECT pg_backend_pid()``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_adrq.doctor.report import PgBouncer, first_line


def detect(conn: Connection, timeout: int) -> PgBouncer:
    """Whether ``conn`` goes through PgBouncer; ``timeout``: seconds to wait for each connection opened."""
    ours = _socket_ports(conn)
    row = conn.execute(sa.text("SELECT inet_client_port(), inet_server_port()")).one()
    theirs = (row[0], row[1]) if row[0] is not None else None
    if ours is not None and theirs is not None and ours == theirs:
        return PgBouncer(
            False, f"no: the server sees this connection's own TCP ports ({ours[0]} -> {ours[1]})"
        )
    if ours is None and theirs is None:
        between = "both ends are Unix sockets"
    elif ours is None or theirs is None:
        between = "this end is a Unix socket and the server's is TCP, or the reverse"
    else:
        between = f"ports {ours[0]} -> {ours[1]} here, {theirs[0]} -> {theirs[1]} at the server"
    detected, how, mode = _admin_console(conn.engine, timeout)
    how = f"{between}; {how}"
    if detected is False:
        return PgBouncer(False, how)
    mode_how = "SHOW DATABASES / SHOW CONFIG" if mode else None
    if detected and mode is None:
        mode, mode_how = _pool_mode_by_behaviour(conn.engine)
    return PgBouncer(detected, how, mode, mode_how)


def _socket_ports(conn: Connection) -> tuple[int, int] | None:
    """``(local port, remote port)`` of the connection's socket; ``None`` for a Unix socket or no access."""
    raw: Any = conn.connection.dbapi_connection
    try:
        fd = int(raw.fileno())
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return None
            return int(sock.getsockname()[1]), int(sock.getpeername()[1])
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def _admin_console(engine: Engine, timeout: int) -> tuple[bool | None, str, str | None]:
    """``(is PgBouncer, what was seen, pool mode)`` from database ``pgbouncer``, same host and user."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url.set(database="pgbouncer"))
    try:
        console: Any = engine.dialect.connect(*cargs, **{**cparams, "connect_timeout": timeout})
    except Exception as exc:
        message = first_line(exc)
        if "not allowed" in message:
            return True, "its admin console says 'not allowed' to this user", None
        if 'database "pgbouncer" does not exist' in message:
            return False, "a PostgreSQL server answers for database pgbouncer: not PgBouncer", None
        return None, f"its admin console did not answer: {message}", None
    try:
        console.autocommit = True
        cursor = console.cursor()
        cursor.execute("SHOW VERSION")
        version = " ".join(str(v) for v in cursor.fetchone() or ())
        cursor.execute("SHOW DATABASES")
        names = [d[0] for d in cursor.description]
        records = [dict(zip(names, row, strict=False)) for row in cursor.fetchall()]
        modes = [
            r["pool_mode"] for r in records if r.get("name") == engine.url.database and r.get("pool_mode")
        ]
        if not modes:
            cursor.execute("SHOW CONFIG")
            modes = [row[1] for row in cursor.fetchall() if row[0] == "pool_mode"]
        mode = str(modes[-1]) if modes else None
        return True, f"its admin console answers SHOW VERSION: {version}", mode
    except Exception as exc:
        return None, f"database pgbouncer answered, but not as PgBouncer's console: {first_line(exc)}", None
    finally:
        with contextlib.suppress(Exception):
            console.close()


def _pool_mode_by_behaviour(engine: Engine) -> tuple[str, str]:
    """Tell transaction from session pooling by which server process two connections in a row get."""
    pid = "SELECT pg_backend_pid()"
    with engine.connect() as first:
        first_pid = first.exec_driver_sql(pid).scalar()
        first.rollback()  # transaction pooling hands its server connection back here
        with engine.connect() as second:
            second_pid = second.exec_driver_sql(pid).scalar()
            second.rollback()
    if first_pid == second_pid:
        return "transaction", "a 2nd connection got the 1st one's server process while it was connected"
    return "session (probably)", "a 2nd connection got another server process while the 1st was connected"
