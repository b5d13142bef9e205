"""What an engine sends: the statements (:func:`recorded`), or how many per thread (:data:`counting`).

The tests record (``with recorded(engine) as seen``) to assert on the SQL sent
while a block runs; the benchmark counts, always on and cheap, the statements
each producer thread sends per transaction.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

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

    def on_execute(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        seen.statements.append(statement)
        seen.parameters.append(parameters)
        seen.executemany.append(executemany)

    def on_commit(_conn: Any) -> None:
        seen.commits += 1

    sa.event.listen(target, "before_cursor_execute", on_execute)
    sa.event.listen(target, "commit", on_commit)
    try:
        yield seen
    finally:
        sa.event.remove(target, "before_cursor_execute", on_execute)
        sa.event.remove(target, "commit", on_commit)


class StatementCounter(threading.local):
    """The number of statements the current thread sent since its last :meth:`reset`."""

    statements = 0

    def count_statements(self, engine: Engine) -> None:
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
        def _count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if not statement.lstrip().upper().startswith("BEGIN"):
                self.statements += 1

    def reset(self) -> None:
        self.statements = 0

    def value(self) -> int:
        return self.statements


#: The benchmark's counter: its engines count into it (:meth:`StatementCounter.count_statements`),
#: its producer loops reset and read it around each transaction.
counting = StatementCounter()
