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
    ``executemany`` counts once per parameter set: psycopg2 sends one
    statement per set (Airflow 3.3's PostgreSQL path is such an executemany;
    SQLAlchemy's "insertmanyvalues" batching, when it applies, reaches this
    hook as single multi-row statements instead).
    """

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        if statement.lstrip().upper().startswith("BEGIN"):
            return
        sent = len(parameters) if executemany else 1
        _local.statements = getattr(_local, "statements", 0) + sent


def reset() -> None:
    _local.statements = 0


def value() -> int:
    return int(getattr(_local, "statements", 0))
