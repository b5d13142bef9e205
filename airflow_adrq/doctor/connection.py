"""The one read-only transaction doctor reads in, and the read helpers its probes share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection
from sqlalchemy.pool import NullPool

from airflow_adrq.doctor import backends
from airflow_adrq.doctor.report import DoctorError

__all__ = ["read_only_connection", "rows", "scalar"]


@contextlib.contextmanager
def read_only_connection(url: str | URL, schema: str | None = None) -> Iterator[Connection]:
    """A connection to ``url`` inside one read-only transaction, rolled back at the end.

    ``schema``: the PostgreSQL schema Airflow's tables are in (``[database]
    sql_alchemy_schema``); unqualified names resolve there first.

    A write attempted on it is refused by the server (PostgreSQL SQLSTATE
    25006, MySQL/MariaDB 1792, SQLite "attempt to write a readonly
    database"). Raises :class:`DoctorError` for a backend Airflow does not run
    on, a SQLite file that does not exist, or a ``schema`` off PostgreSQL.
    """
    url = sa.make_url(url)
    probe = backends.get(url)
    url, connect_args = probe.engine_args(url)
    engine = sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            # SQLAlchemy's first-connect checks ran in a transaction of their
            # own; start from none, so the read-only one is the first.
            conn.rollback()
            probe.begin_read_only(conn)
            try:
                if schema:
                    if probe.search_path is None:
                        raise DoctorError(
                            f"[database] sql_alchemy_schema ({schema!r}) is only checked on PostgreSQL; on "
                            "MySQL/MariaDB name Airflow's database in the URL instead"
                        )
                    probe.search_path(conn, schema)
                yield conn
            finally:
                conn.rollback()
    finally:
        engine.dispose()


def scalar(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(sa.text(sql), params).scalar()


def rows(conn: Connection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sa.text(sql))]
