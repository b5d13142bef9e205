"""PostgreSQL: ``INSERT ... ON CONFLICT``.

``ON CONFLICT DO NOTHING`` does not lock a committed conflicting row; it only
waits for a transaction that inserted the same key and has not finished yet
(speculative insertion). The rows we insert are locked in the order the
SELECT produces them, which is why the statement ends in ``ORDER BY``.
FK checks take ``FOR KEY SHARE`` on the ``dag`` and ``asset`` rows, which
concurrent producers share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Select, Table, func
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.sql.dml import Insert

from airflow_adrq.dialects import ConflictMode, DialectSupport, register


def _insert_from_select(
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
    stmt = postgresql.insert(table).from_select(list(columns), select)
    if on_conflict == "ignore":
        return stmt.on_conflict_do_nothing(index_elements=list(key))
    # Only move the timestamp forwards; the WHERE keeps an unchanged row from
    # being rewritten (PostgreSQL still locks it, as DO UPDATE always does).
    return stmt.on_conflict_do_update(
        index_elements=list(key),
        set_={refresh: func.greatest(table.c[refresh], stmt.excluded[refresh])},
        where=table.c[refresh] < stmt.excluded[refresh],
    )


def _insert_ignore(table: Table) -> Insert:
    return postgresql.insert(table).on_conflict_do_nothing()


def _configure_engine(engine: Engine) -> None:
    # PostgreSQL's default READ COMMITTED is what the guarantees assume.
    return None


SUPPORT = register("postgresql")(
    DialectSupport(
        name="postgresql",
        insert_from_select=_insert_from_select,
        insert_ignore=_insert_ignore,
        engine_kwargs={},
        configure_engine=_configure_engine,
    )
)
