"""Where concurrent producers' sessions are, sampled from the server while a benchmark runs.

Start it next to a contention run, on the same server::

    python benchmarks/sample_waits.py --db postgresql://root@127.0.0.1/postgres --seconds 60 &
    airflow-adrq bench --airflow --db postgresql://root@127.0.0.1/postgres --no-sweep --manager plugin

Every ``--every-ms`` it reads what each other client session of the server is
doing (PostgreSQL: ``pg_stat_activity``'s state, wait event and query;
MariaDB/MySQL: ``information_schema.PROCESSLIST``'s command, state and
query, and whether InnoDB has it waiting for a lock) and counts, per kind of
statement, the samples spent running, waiting for a lock, waiting for
something else, and idle in a transaction (the client's turn: Python, or the
network). Prints the counts as shares of all busy samples. Reads only the
server's own views; needs a user that sees the other sessions (superuser /
PROCESS).

Not part of either distribution: a tool for BENCHMARKS.md's profile section.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

import sqlalchemy as sa

#: The kind of statement a session is in, from the start of its text (first match wins).
KINDS = [
    ("queue write (ours)", r"(WITH ev AS|INSERT INTO asset_dag_run_queue .* SELECT)"),
    (
        "stamp (ours)",
        r"(WITH stamped_events|SELECT utc_timestamp|UPDATE asset_event SET|UPDATE asset_dag_run_queue SET)",
    ),
    (
        "queue write (Airflow's)",
        r"(INSERT INTO asset_dag_run_queue|SAVEPOINT|RELEASE SAVEPOINT|SELECT asset_dag_run_queue)",
    ),
    ("event insert", r"INSERT INTO asset_event"),
    ("asset lookup", r"SELECT asset\."),
    ("consumers", r"SELECT dag\."),
    ("task instance", r"(SELECT task_instance|UPDATE task_instance)"),
    ("COMMIT", r"COMMIT"),
]

_PG = """
SELECT state, coalesce(wait_event_type, ''), query FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname NOT IN ('postgres')
"""
_MYSQL = """
SELECT p.COMMAND, coalesce(p.INFO, ''),
       EXISTS (SELECT 1 FROM information_schema.INNODB_TRX t WHERE t.trx_mysql_thread_id = p.ID),
       EXISTS (SELECT 1 FROM information_schema.INNODB_TRX t
                WHERE t.trx_mysql_thread_id = p.ID AND t.trx_state = 'LOCK WAIT')
  FROM information_schema.PROCESSLIST p
 WHERE p.ID <> CONNECTION_ID() AND p.COMMAND <> 'Daemon' AND coalesce(p.DB, '') NOT IN ('mysql')
"""


def _kind(query: str) -> str:
    return next((name for name, pattern in KINDS if re.match(pattern, query.lstrip(), re.I | re.S)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="any database on the server the benchmark uses")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every-ms", type=float, default=10.0)
    args = parser.parse_args()
    engine = sa.create_engine(args.db, isolation_level="AUTOCOMMIT")
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    deadline = time.monotonic() + args.seconds
    with engine.connect() as conn:
        postgres = conn.dialect.name == "postgresql"
        while time.monotonic() < deadline:
            for row in conn.exec_driver_sql(_PG if postgres else _MYSQL):
                if postgres:
                    state, wait, query = row
                    state = state or ""
                    if state == "idle":
                        continue
                    where = (
                        "idle in transaction"
                        if state.startswith("idle in")
                        else (
                            "waiting for a lock"
                            if wait == "Lock"
                            else f"waiting ({wait})"
                            if wait
                            else "running"
                        )
                    )
                else:
                    command, query, in_transaction, lock_wait = row
                    if command == "Sleep" and not in_transaction:
                        continue
                    where = (
                        "idle in transaction"
                        if command == "Sleep"
                        else "waiting for a lock"
                        if lock_wait
                        else "running"
                    )
                counts[(_kind(query or ""), where)] += 1
            time.sleep(args.every_ms / 1000)
    total = sum(counts.values()) or 1
    print(f"{total} busy samples")
    for (kind, where), n in counts.most_common():
        print(f"{n / total:6.1%}  {kind:<26} {where}")


if __name__ == "__main__":
    main()
