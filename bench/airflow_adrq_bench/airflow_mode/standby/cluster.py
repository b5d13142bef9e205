"""A throwaway PostgreSQL primary and a streaming hot standby of it, and the transaction held open on it.

The primary is :func:`airflow_adrq_testing.servers.start_postgresql` with the settings of
:data:`PRIMARY_SETTINGS`; the standby is ``pg_basebackup -R`` of it (through a replication slot, so
the primary keeps every WAL segment the standby has not replayed) into a scratch directory, started on
a port of its own with :data:`STANDBY_SETTINGS`. Both run as the ``postgres`` account when we are
root, as the primary does; both are stopped (fast shutdown) and their directories removed on exit,
whatever happened inside.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq_bench.errors import BenchError
from airflow_adrq_testing import servers

# servers.py's private helpers are reused on purpose (the brief of issue 39): the scratch directory
# owned by the server's account, the TCP executor and its start/stop with the log's tail on failure.
_scratch = servers._scratch
_executor = servers._executor
_running = servers._running
_as = servers._as

#: The primary: WAL for a standby (the default level, named because it is needed); a slot's worth of
#: senders. ``max_connections`` (300, the throwaway server's) must be matched by the standby.
PRIMARY_SETTINGS: Final = {"wal_level": "replica", "max_wal_senders": "4"}
#: The standby. ``hot_standby_feedback``: on, as on a read replica that serves a scheduler's reads
#: (without it the primary's vacuum may remove rows a standby query still reads, and replay cancels
#: that query after ``max_standby_streaming_delay``); the open transaction holds the primary's
#: horizon back anyway, so it changes nothing of what is measured here.
STANDBY_SETTINGS: Final = {
    "hot_standby": "on",
    "hot_standby_feedback": "on",
    "max_connections": "300",
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
}
_SLOT = "adrq_standby"
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Pair:
    """The primary's and the standby's superuser URLs (database ``postgres``), the version, their
    settings, and the scratch directories they run in (removed when they stop)."""

    primary_url: str
    standby_url: str
    version: str
    settings: dict[str, dict[str, str]]
    directories: tuple[str, ...]

    def standby_of(self, url: str) -> str:
        """``url`` (a database on the primary) on the standby: the same database name, the standby's port."""
        standby = sa.make_url(self.standby_url)
        moved = sa.make_url(url).set(host=standby.host, port=standby.port)
        return moved.render_as_string(hide_password=False)


@contextlib.contextmanager
def primary_and_standby(extra: Mapping[str, str] | None = None) -> Iterator[Pair]:
    """Start the primary and its standby (``extra``: more settings of both); yield them streaming."""
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(servers.start_postgresql({**PRIMARY_SETTINGS, **(extra or {})}))
        tmp, as_user = stack.enter_context(_scratch("standby", "postgres"))
        bindir = servers._postgresql_bindir()
        source = sa.make_url(primary.url)
        data, log = tmp / "data", tmp / "server.log"
        # -R: standby.signal and primary_conninfo; -C -S: the slot; -X stream: WAL during the copy too.
        backup = [str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres"]
        backup += ["-D", str(data), "-R", "-X", "stream", "-C", "-S", _SLOT, "-c", "fast"]
        made = subprocess.run(backup, capture_output=True, text=True, check=False, **_as(as_user))
        if made.returncode != 0:
            raise BenchError(f"pg_basebackup failed (exit {made.returncode}): {made.stderr.strip()}")
        port = servers.free_port()
        settings = {
            **STANDBY_SETTINGS,
            **(extra or {}),
            "port": str(port),
            "unix_socket_directories": str(tmp),
        }
        command = [str(bindir / "postgres"), "-D", str(data)]
        command += [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        # postgres logs to stderr, which the executor drops: sh sends it to the log file, then is postgres.
        command = ["/bin/sh", "-c", f'exec "$@" 2>>"{log}"', "postgres", *command]
        # SIGINT: a fast shutdown (the standby's sessions end, nothing is left to recover).
        executor = _executor(command, port, signal.SIGINT, as_user)
        stack.enter_context(_running(executor, "the standby", log))
        standby_url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
        _wait_for_hot_standby(standby_url, log)
        stack.callback(_drop_slot, primary.url)
        settings_of = {"primary": {**PRIMARY_SETTINGS, **(extra or {})}, "standby": settings}
        yield Pair(
            primary.url, standby_url, primary.version, settings_of, (_directory_of(primary.url), str(tmp))
        )


def _directory_of(url: str) -> str:
    """The scratch directory a throwaway server runs in: its data directory's parent."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return str(Path(conn.exec_driver_sql("SHOW data_directory").scalar_one()).parent)
    finally:
        engine.dispose()


def _wait_for_hot_standby(url: str, log: Path) -> None:
    """Until the standby accepts read-only sessions (it refuses them until its replay is consistent)."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        while True:
            try:
                with engine.connect() as conn:
                    if conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar_one():
                        return
                    raise BenchError("the standby is not in recovery: it was promoted or is no standby")
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                    raise BenchError(
                        f"the standby accepted no session in {_START_TIMEOUT_S:g} s:\n{tail}"
                    ) from None
                time.sleep(0.2)
    finally:
        engine.dispose()


def _drop_slot(primary_url: str) -> None:
    # Before the primary stops: nothing depends on it, but a left slot would keep WAL on a reused server.
    engine = sa.create_engine(primary_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with contextlib.suppress(sa.exc.DBAPIError), engine.connect() as conn:
        active = "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %(s)s"
        conn.exec_driver_sql(active, {"s": _SLOT})
        time.sleep(0.2)
        conn.exec_driver_sql("SELECT pg_drop_replication_slot(%(s)s)", {"s": _SLOT})
    engine.dispose()


# --- what the benchmark reads of them --------------------------------------------------------

_REPLICATION = """
SELECT application_name, state, sync_state, sent_lsn::text, replay_lsn::text,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), replay_lsn)::bigint AS replay_behind_bytes,
       extract(epoch FROM replay_lag)::float AS replay_lag_s
FROM pg_stat_replication"""


def replication(primary: sa.Connection) -> list[dict[str, Any]]:
    """The primary's ``pg_stat_replication`` rows: who streams, how far behind its replay is."""
    return [dict(row._mapping) for row in primary.exec_driver_sql(_REPLICATION)]


def wait_for_replay(primary: sa.Engine, standby: sa.Engine, timeout_s: float = 120.0) -> float:
    """Until the standby has replayed the primary's WAL as of now; seconds it took."""
    started = time.monotonic()
    with primary.connect() as conn:
        # The insert position, not pg_current_wal_lsn() (written): an asynchronous COMMIT (the
        # throwaway primary runs synchronous_commit=off) may still be in the WAL buffers.
        target = str(conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()::text").scalar_one())
    with standby.connect() as conn:
        while True:
            sql = "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), %(t)s::pg_lsn) >= 0"
            if conn.exec_driver_sql(sql, {"t": target}).scalar_one():
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise BenchError(f"the standby did not replay up to {target} within {timeout_s:g} s")
            conn.rollback()
            time.sleep(0.05)


class OpenTransaction:
    """A session on the primary that took an XID and stays ``idle in transaction``: the snapshot
    horizon (``xmin``) every later transaction, and every standby snapshot, is measured from."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, poolclass=NullPool)
        self.conn = self.engine.connect()
        # An XID of its own: the classic trigger (GitLab's long transaction did write).
        self.xid = int(self.conn.exec_driver_sql("SELECT txid_current()").scalar_one())
        self.started = time.monotonic()

    def age(self, other: sa.Connection) -> dict[str, float]:
        """How old it is now: seconds, and XIDs assigned since it took its own (``age(xid)``)."""
        sql = "SELECT txid_snapshot_xmax(txid_current_snapshot()) - %(x)s"
        xids = int(other.exec_driver_sql(sql, {"x": self.xid}).scalar_one())
        return {"seconds": time.monotonic() - self.started, "xids_since": xids}

    def close(self) -> None:
        """End it (ROLLBACK) and its session."""
        with contextlib.suppress(sa.exc.DBAPIError):
            self.conn.rollback()
        self.conn.close()
        self.engine.dispose()


def overflow_subtransactions(url: str, dag_ids: list[str], count: int) -> None:
    """One committed transaction on the primary with ``count`` subtransactions that each took an XID
    (a ``FOR SHARE`` row lock, as the plug-in's SAVEPOINT does, on the consumers' ``dag`` rows in
    turn); past 64 the primary logs them in an XLOG_XACT_ASSIGNMENT record, and the standby marks every
    snapshot whose xmin is older ``suboverflowed`` (procarray.c ``lastOverflowedXid``) for as long as the
    open transaction lasts. The known trigger, for contrast."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("SELECT txid_current()")
            for n in range(count):  # nested: each stays open, so the session's 64-entry cache overflows
                conn.exec_driver_sql(f"SAVEPOINT adrq_overflow_{n}")
                lock = "SELECT dag_id FROM dag WHERE dag_id = %(d)s FOR SHARE"
                conn.exec_driver_sql(lock, {"d": dag_ids[n % len(dag_ids)]})
    finally:
        engine.dispose()
