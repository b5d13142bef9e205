"""``INSERT ... ON CONFLICT``, shared by the backends that speak it (PostgreSQL, SQLite).

Their SQLAlchemy ``Insert`` constructs have the same ``on_conflict_do_*``
API; only the insert factory and the name of the two-argument maximum
(``greatest`` / SQLite's scalar ``max``) differ: bind them with ``functools.partial``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Column, Select, Table, func
from sqlalchemy.sql.dml import Insert

from airflow_adrq.dialects import ConflictMode


def insert_from_select(
    insert: Callable[[Table], Any],
    greatest: str,
    table: Table,
    columns: Sequence[Column[Any]],
    select: Select[Any],
    key: Sequence[str],
    on_conflict: ConflictMode,
    refresh: str,
) -> Insert:
    """``DialectSupport.insert_from_select`` for an ``ON CONFLICT`` dialect."""
    stmt = insert(table).from_select(list(columns), select)
    if on_conflict == "ignore":
        return stmt.on_conflict_do_nothing(index_elements=list(key))  # type: ignore[no-any-return]
    # Only move the timestamp forwards; the WHERE keeps an unchanged row
    # from being rewritten (PostgreSQL still locks it, as DO UPDATE does).
    new_value = getattr(func, greatest)(table.c[refresh], stmt.excluded[refresh])
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=list(key),
        set_={refresh: new_value},
        where=table.c[refresh] < stmt.excluded[refresh],
    )
