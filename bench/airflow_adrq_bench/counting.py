"""Count the statements a thread sends (one transaction per thread at a time)."""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = ["count_statements", "reset", "value"]

_local = threading.local()


def count_statements(engine: Engine) -> None:
    """Count every statement ``engine`` sends, per thread.

    SAVEPOINT and RELEASE count; BEGIN does not (PostgreSQL and MySQL send it
    implicitly, SQLite's BEGIN IMMEDIATE goes through the cursor). An
    ``executemany`` counts once: every driver the benchmark supports sends it
    in one round trip (psycopg 3 pipelines the parameter sets, each still
    executed as its own INSERT; psycopg2 with SQLAlchemy's "insertmanyvalues"
    and mysqlclient send one multi-row INSERT). Airflow 3.3's PostgreSQL
    queue write is such an executemany, one parameter set per consumer DAG.
    """

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        if statement.lstrip().upper().startswith("BEGIN"):
            return
        _local.statements = getattr(_local, "statements", 0) + 1


def reset() -> None:
    _local.statements = 0


def value() -> int:
    return int(getattr(_local, "statements", 0))
