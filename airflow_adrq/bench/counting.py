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
    executemany counts once.
    """

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.lstrip().upper().startswith("BEGIN"):
            _local.statements = getattr(_local, "statements", 0) + 1


def reset() -> None:
    _local.statements = 0


def value() -> int:
    return int(getattr(_local, "statements", 0))
