"""The one SQL recorder of the test suite: every statement an engine (or every engine) sends."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

# PostgreSQL and SQLite render the statement's CTE before INSERT, MySQL after it.
QUEUE_INSERT = re.compile(
    r"^\s*(WITH\s.*)?INSERT\s+INTO\s+[`\"]?asset_dag_run_queue\b", re.IGNORECASE | re.DOTALL
)


#: Statements that read or only manage the transaction.
_READS = (
    *("SELECT", "SHOW", "DESCRIBE", "PRAGMA"),
    *("SET", "BEGIN", "START TRANSACTION", "ROLLBACK", "SAVEPOINT", "RELEASE"),
)
_MODIFIES = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


def is_read(statement: str) -> bool:
    """Whether ``statement`` reads (a ``WITH`` counts if it has no data-modifying part)."""
    upper = " ".join(statement.split()).upper()
    if upper.startswith("WITH "):
        return not _MODIFIES.search(upper)
    return upper.startswith(_READS)


@dataclass
class Recording:
    """What was sent while recording: statements (as sent), their parameters, executemany flags, commits."""

    statements: list[str] = field(default_factory=list)
    parameters: list[Any] = field(default_factory=list)
    executemany: list[bool] = field(default_factory=list)
    commits: int = 0

    def normalized(self) -> list[str]:
        """The statements with whitespace collapsed."""
        return [" ".join(s.split()) for s in self.statements]

    def writes(self) -> list[str]:
        """The statements (normalized) that are not reads (:func:`is_read`)."""
        return [s for s in self.normalized() if not is_read(s)]

    def queue_inserts(self) -> list[tuple[str, Any, bool]]:
        """``(statement, parameters, executemany)`` of every INSERT into ``asset_dag_run_queue``."""
        return [
            (s, p, many)
            for s, p, many in zip(self.statements, self.parameters, self.executemany, strict=True)
            if QUEUE_INSERT.match(s)
        ]


@contextlib.contextmanager
def recorded(target: Any = sa.Engine) -> Iterator[Recording]:
    """Record what ``target`` (an engine; default: every engine) sends until the block ends."""
    seen = Recording()

    def on_execute(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.statements.append(statement)
        seen.parameters.append(parameters)
        seen.executemany.append(executemany)

    def on_commit(conn):  # type: ignore[no-untyped-def]
        seen.commits += 1

    sa.event.listen(target, "before_cursor_execute", on_execute)
    sa.event.listen(target, "commit", on_commit)
    try:
        yield seen
    finally:
        sa.event.remove(target, "before_cursor_execute", on_execute)
        sa.event.remove(target, "commit", on_commit)
