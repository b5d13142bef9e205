"""PostgreSQL: ``INSERT ... ON CONFLICT``.

``ON CONFLICT DO NOTHING`` does not lock a committed conflicting row; it only waits for a transaction
that inserted the same key and has not finished yet (speculative insertion). The rows we insert are
locked in the order the SELECT produces them, hence its ``ORDER BY``. FK checks take ``FOR KEY
SHARE`` on the ``dag`` and ``asset`` rows, which concurrent producers share. The consumers' ``dag``
rows are share-locked (``FOR SHARE OF dag``, which Airflow's scheduler skips: ``FOR NO KEY UPDATE
SKIP LOCKED``) in ``dag_id COLLATE "C"`` order: the Sort node sits below LockRows.
"""

from __future__ import annotations

import functools

from sqlalchemy import func
from sqlalchemy.dialects import postgresql

from airflow_adrq.dialects import DialectSupport, on_conflict_insert_from_select
from airflow_adrq.tables import UtcDateTime

SUPPORT = DialectSupport(
    name="postgresql",
    insert_from_select=functools.partial(on_conflict_insert_from_select, postgresql.insert, "greatest"),
    insert_ignore=lambda table: postgresql.insert(table).on_conflict_do_nothing(),
    # The start of the statement that reads it, which runs once the rows are locked: one value for
    # the whole statement.
    clock=lambda: func.statement_timestamp(type_=UtcDateTime()),
    stamp_in_one_statement=True,
    # Byte order, as Python sorts the ids the DAG processor flushes: a database collated en_US.UTF-8
    # sorts 'B' after 'a', "C" before it.
    lock_order=lambda dag_id: dag_id.collate("C"),
    # The wall clock when it is evaluated: in the one-statement write it is read after the share
    # locks are held (statement_timestamp() is before).
    clock_after_locks=lambda: func.clock_timestamp(type_=UtcDateTime()),
    # PostgreSQL's default READ COMMITTED is what the guarantees assume: no engine settings.
)
