"""PostgreSQL: ``INSERT ... ON CONFLICT``.

``ON CONFLICT DO NOTHING`` does not lock a committed conflicting row; it only
waits for a transaction that inserted the same key and has not finished yet
(speculative insertion). The rows we insert are locked in the order the
SELECT produces them, which is why the statement ends in ``ORDER BY``.
FK checks take ``FOR KEY SHARE`` on the ``dag`` and ``asset`` rows, which
concurrent producers share.
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql

from airflow_adrq.dialects import DialectSupport, _on_conflict, register

SUPPORT = register("postgresql")(
    DialectSupport(
        name="postgresql",
        insert_from_select=_on_conflict.insert_from_select(postgresql.insert, "greatest"),
        insert_ignore=_on_conflict.insert_ignore(postgresql.insert),
        # WITH ev AS (UPDATE asset_event ... RETURNING ...) INSERT ...: one round trip.
        stamp_in_statement=True,
        # PostgreSQL's default READ COMMITTED is what the guarantees assume:
        # no engine settings.
    )
)
