"""PostgreSQL: a ``READ ONLY`` snapshot; PgBouncer; ``pg_stat_database`` and ``pg_stat_statements``.

Every setting is transaction-scoped (``SET TRANSACTION``, ``set_config(...,
true)``): nothing stays on a server connection PgBouncer hands to someone
else. The deadlock counter is this database's own: the verdict cites it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from airflow_adrq.doctor import pgbouncer
from airflow_adrq.doctor.backends import Probe, information_schema_collations, scalar
from airflow_adrq.doctor.report import Compatibility, Exposure, QueueInsert, first_line

_HIDDEN = "<insufficient privilege>"


def _search_path(conn: Connection, schema: str) -> None:
    # The old path stays after it: `airflow db migrate` leaves alembic_version
    # in the connection's default schema.
    conn.execute(
        sa.text(
            "SELECT set_config('search_path', "
            "quote_ident(:schema) || ', ' || current_setting('search_path'), true)"
        ),
        {"schema": schema},
    )


def _collations(conn: Connection) -> dict[str, str]:
    default = scalar(conn, "SELECT datcollate FROM pg_database WHERE datname = current_database()")
    return information_schema_collations(conn, "current_schema()", default)


def _compatibility(conn: Connection, compatibility: Compatibility) -> list[str]:
    compatibility.pgbouncer = pgbouncer.detect(conn)
    return []


def _classify_insert(query: str) -> str:
    q = " ".join(query.split()).lower()
    if "select" in q and "asset_event" in q:
        return "airflow-adrq's statement (INSERT ... SELECT)"
    if "values" in q:
        return "Airflow's own insert (INSERT ... VALUES)"
    return "other insert"


def _stats(conn: Connection, exposure: Exposure) -> list[str]:
    row = conn.execute(
        sa.text("SELECT deadlocks, stats_reset FROM pg_stat_database WHERE datname = current_database()")
    ).first()
    if row is not None:
        exposure.deadlocks = int(row[0] or 0)
        since = f"since {row[1]:%Y-%m-%d %H:%M}" if row[1] is not None else "since the cluster was created"
        exposure.deadlocks_scope = f"this database, any table, {since}"
    schema = scalar(
        conn,
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_stat_statements'",
    )
    if schema is None:
        exposure.queue_inserts_note = "pg_stat_statements is not installed in this database"
        return []
    if scalar(conn, "SELECT current_setting('pg_stat_statements.max', true)") is None:
        exposure.queue_inserts_note = "pg_stat_statements is installed but not in shared_preload_libraries"
        return []
    quoted = conn.dialect.identifier_preparer.quote_identifier(str(schema))
    mean = "mean_exec_time" if int(scalar(conn, "SHOW server_version_num")) >= 130000 else "mean_time"
    try:
        # A view missing or a privilege lacking must not end the transaction.
        with conn.begin_nested():
            found = conn.execute(
                sa.text(
                    f"SELECT query, calls, {mean} FROM {quoted}.pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) AND "
                    f"(query ILIKE '%insert into asset_dag_run_queue%' OR query = '{_HIDDEN}')"
                )
            ).all()
    except DBAPIError as exc:
        exposure.queue_inserts_note = f"pg_stat_statements unreadable: {first_line(exc)}"
        return []
    totals: dict[str, list[float]] = {}
    for query, calls, mean_ms in found:
        if query != _HIDDEN:
            total = totals.setdefault(_classify_insert(str(query)), [0, 0.0])
            total[0] += int(calls)
            total[1] += int(calls) * float(mean_ms)
    exposure.queue_inserts = [
        QueueInsert(kind, int(calls), (time / calls) if calls else 0.0)
        for kind, (calls, time) in totals.items()
    ]
    if not exposure.queue_inserts:
        exposure.queue_inserts_note = "pg_stat_statements has no insert into asset_dag_run_queue yet"
    if any(r[0] == _HIDDEN for r in found):
        return ["pg_stat_statements hides other users' queries from this user (grant pg_read_all_stats)"]
    return []


PROBE = Probe(
    name="postgresql",
    # Unlike default_transaction_read_only, nothing stays on the server connection.
    begin_read_only=("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",),
    search_path=_search_path,
    server=lambda conn: f"PostgreSQL {scalar(conn, 'SHOW server_version')}",
    collations=_collations,
    compatibility=_compatibility,
    stats=_stats,
    deadlock_counter="PostgreSQL",
)
