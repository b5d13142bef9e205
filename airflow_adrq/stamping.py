"""The stamp: one reading of the database's clock, put on a transaction's events.

A module of its own so that both writers use it without importing each other:
:mod:`airflow_adrq.queue` (MySQL 8, SQLite, PostgreSQL's large transactions) and
:mod:`airflow_adrq.refresh` (MariaDB). PostgreSQL's usual write reads the clock
inside its one statement (:func:`airflow_adrq.statement.write_once`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from airflow_adrq import dialects, statement
from airflow_adrq.tables import utcnow

__all__ = ["IDS_PER_STATEMENT", "clock_on_events"]

#: Ids bound to one statement, below SQLite's 32,766 and psycopg 3's 65,535
#: bound-parameter limits. Larger sets: several statements.
IDS_PER_STATEMENT = 30_000


def clock_on_events(conn: Connection, ids: list[int], options: Mapping[str, Any]) -> dt.datetime:
    """One reading of the database's clock (SQLite: Python's), put on the events ``ids``; returns it.

    Where the stamp is a statement of its own (not PostgreSQL's one-statement write).
    Locks the given ``asset_event`` rows (the caller's own, uncommitted).
    """
    clock = dialects.get(conn).clock
    stamp = conn.execute(select(clock())).scalar_one() if clock is not None else utcnow()
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        chunk = ids[start : start + IDS_PER_STATEMENT]
        conn.execute(statement.STAMP_EVENTS, {"ids": chunk, "stamp": stamp}, execution_options=options)
    return stamp
