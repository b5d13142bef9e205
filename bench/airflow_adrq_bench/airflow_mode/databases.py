"""The databases every Airflow mode measures on (scratch databases only: a URL that names an Airflow
metadata database is refused), and the controller's plain-SQL reads of them (it never imports Airflow)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq_bench import options
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_testing import dataset
from airflow_adrq_testing.dataset import Target as Target

#: Tables whose presence means "this is an Airflow metadata database": never benchmarked.
AIRFLOW_TABLES = ("dag", "dag_run", "task_instance", "asset_dag_run_queue", "serialized_dag", "dag_bundle")

# Airflow 3.3 runs on these sync drivers (SQLAlchemy 2.1 maps a bare
# postgresql:// to psycopg 3, which Airflow 3.3 does not default to).
_AIRFLOW_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb", "mariadb": "mysql+mysqldb"}

# Per dialect: how to read a setting, and the settings read.
_SETTINGS = {
    "postgresql": ("SHOW {}", ["deadlock_timeout"]),
    "mysql": ("SELECT @@{}", ["innodb_lock_wait_timeout", "innodb_deadlock_detect"]),
}

# The transactions still open on this database, other than the reader's own (client sessions only).
_OPEN = {
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND xact_start IS NOT NULL",
    "mysql": "SELECT t.trx_mysql_thread_id FROM information_schema.innodb_trx t JOIN "
    "information_schema.processlist p ON p.id = t.trx_mysql_thread_id "
    "WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()",
}
_END = {"postgresql": "SELECT pg_terminate_backend({})", "mysql": "KILL {}"}


def airflow_url(url: str | sa.engine.URL) -> str:
    """``url`` with the sync driver Airflow 3.3 uses when none is named (``postgresql+psycopg2`` ...)."""
    parsed = sa.make_url(url)
    driver = _AIRFLOW_DRIVERS.get(parsed.drivername)
    return (parsed.set(drivername=driver) if driver else parsed).render_as_string(hide_password=False)


def describe(url: str) -> Target:
    """The server at ``url`` (:func:`airflow_adrq_testing.dataset.describe`), reached by Airflow's driver."""
    return dataset.describe(url, airflow_url)


def refuse_airflow_database(url: str) -> None:
    """Raise :class:`BenchError` if the database ``url`` names already has Airflow tables."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and (
        not parsed.database or parsed.database == ":memory:" or not Path(parsed.database).exists()
    ):
        return
    with sa.create_engine(url, poolclass=NullPool).connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
    found = [name for name in AIRFLOW_TABLES if name in names]
    if found:
        raise BenchError(
            f"refusing {parsed.render_as_string(hide_password=True)}: its database has Airflow tables "
            f"({', '.join(found)}). The benchmark never touches an existing metadata database; give "
            "it a URL of a database without them (it only connects there to create and drop a "
            "scratch database of its own)."
        )


@contextlib.contextmanager
def targets(urls: Sequence[str], backends: Sequence[str] | None, *, sqlite: bool) -> Iterator[list[Target]]:
    """The databases an Airflow mode measures on, with unique names: ``urls`` (``--db``), or else every
    server :func:`.options.servers_found` finds among ``backends`` (stopped at the end if it started
    them), plus SQLite when ``sqlite`` (which also allows SQLite URLs)."""
    with contextlib.ExitStack() as stack:
        for url in urls:
            if not sqlite and sa.make_url(url).get_backend_name() == "sqlite":
                raise BenchError(
                    "SQLite is not measured here: Airflow does not support the LocalExecutor on it"
                )
            refuse_airflow_database(url)
        if not urls:
            local = ["sqlite://"] if sqlite and (not backends or "sqlite" in backends) else []
            urls = local + options.servers_found(stack, backends)
        if not urls:
            raise BenchError("no database to measure on")
        yield dataset.unique_names([describe(url) for url in urls])


def control_engine(url: str) -> sa.Engine:
    """An engine for the controller's reads: no pool, READ COMMITTED on MySQL (each read sees the latest)."""
    kwargs: dict[str, Any] = {"poolclass": NullPool}
    if sa.make_url(url).get_backend_name() in ("mysql", "mariadb"):
        kwargs["isolation_level"] = "READ COMMITTED"
    return sa.create_engine(url, **kwargs)


def clear_queue(engine: sa.Engine) -> None:
    """Empty ``asset_dag_run_queue`` (each measurement starts from an empty queue)."""
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM asset_dag_run_queue"))


def end_transactions(engine: sa.Engine) -> int:
    """End the transactions still open on the database by ending their sessions; how many (SQLite: 0)."""
    name = engine.dialect.name
    if name not in _OPEN:
        return 0
    with engine.connect() as conn:
        ids = [int(i) for i in conn.exec_driver_sql(_OPEN[name]).scalars()]
        for session in ids:
            with contextlib.suppress(sa.exc.DBAPIError):  # it may have ended meanwhile
                conn.exec_driver_sql(_END[name].format(session))
        conn.commit()
    return len(ids)


def queue_rows(conn: sa.Connection) -> int:
    """Rows in ``asset_dag_run_queue`` (the scheduler deletes them as it creates runs)."""
    return int(conn.execute(sa.text("SELECT count(*) FROM asset_dag_run_queue")).scalar_one())


def fetch(conn: sa.Connection, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` with bound ``params``; a list parameter is an expanding ``IN``."""
    lists: list[sa.BindParameter[Any]] = [
        sa.bindparam(k, expanding=True) for k, v in params.items() if isinstance(v, list)
    ]
    return [tuple(row) for row in conn.execute(sa.text(sql).bindparams(*lists), params)]


def analyze(engine: sa.Engine) -> None:
    """Refresh the planner's statistics after seeding, as autovacuum (or an operator) would."""
    if engine.dialect.name == "mysql":
        tables = "dag, asset, asset_active, dag_schedule_asset_reference, asset_event, asset_dag_run_queue"
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ANALYZE TABLE {tables}").fetchall()
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")


def server_settings(engine: sa.Engine) -> dict[str, str]:
    """The server's deadlock and lock-wait settings the results depend on (those it lets us read)."""
    out = {}
    sql, keys = _SETTINGS.get(engine.dialect.name, ("", []))
    with engine.connect() as conn:
        for key in keys:
            with contextlib.suppress(sa.exc.DBAPIError):
                out[key] = str(conn.exec_driver_sql(sql.format(key)).scalar())
    return out


def latest_deadlock(conn: sa.Connection) -> str | None:
    """MySQL/MariaDB: InnoDB's LATEST DETECTED DEADLOCK section (``""``: none); None on other servers or
    without the PROCESS privilege to read it."""
    if conn.dialect.name != "mysql":
        return None
    try:
        row = conn.exec_driver_sql("SHOW ENGINE INNODB STATUS").fetchone()
    except sa.exc.DBAPIError:
        return None
    status = str(row[2]) if row is not None else ""
    start = status.find("LATEST DETECTED DEADLOCK")
    if start < 0:
        return ""
    end = status.find("\nTRANSACTIONS\n", start)
    return status[start : end if end > 0 else start + 6000][:6000]


def rotate(items: Sequence[str], n: int) -> list[str]:
    """``items`` starting at its ``n``-th (modulo): the managers take turns at going first."""
    k = n % len(items) if items else 0
    return [*items[k:], *items[:k]]
