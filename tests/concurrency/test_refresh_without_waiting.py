"""``refresh_after_commit``: existing rows no one holds move forwards before COMMIT, held ones after it.

MariaDB's default (its scheduler locks no rows). The producer's transaction
ends with ``SELECT ... FOR UPDATE SKIP LOCKED`` of its older rows and an
UPDATE of those it got, so they become visible with its event; a row another
transaction holds (a scheduler deleting it, a producer refreshing it) is left
to the short transaction after COMMIT, which never waits either.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import register_asset_change
from airflow_adrq.models import AssetDagRunQueue
from airflow_adrq_testing.recording import recorded
from tests.factories import asset_ref, events

pytestmark = pytest.mark.backends("postgresql", "mysql")

_ADRQ = AssetDagRunQueue.__table__


def _created(engine) -> dict[str, object]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(_ADRQ.c.target_dag_id, _ADRQ.c.created_at)).all())


def _emit(engine, **kw) -> None:
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, on_conflict="refresh_after_commit", **kw)
        session.commit()


def test_free_rows_move_before_commit_and_a_held_row_is_left_to_after_commit(engine, fan):
    asset_id = fan({"a": ["c1", "c2"]})["a"]
    _emit(engine)
    first = _created(engine)
    with engine.connect() as holder:
        # Another transaction holds (a, c2), as a scheduler deleting it would.
        holder.execute(
            sa.select(_ADRQ.c.target_dag_id)
            .where(_ADRQ.c.asset_id == asset_id, _ADRQ.c.target_dag_id == "c2")
            .with_for_update()
        )
        commits: list[int] = []  # how many statements had been sent at each COMMIT

        def on_commit(_conn) -> None:
            commits.append(len(seen.statements))

        with recorded(engine) as seen:
            sa.event.listen(engine, "commit", on_commit)
            try:
                _emit(engine)  # returns at once: nothing waits for the holder
            finally:
                sa.event.remove(engine, "commit", on_commit)
        held_through = _created(engine)
        holder.rollback()
    newest = max(e.timestamp for e in events(engine))
    assert held_through["c1"] == newest > first["c1"]
    assert held_through["c2"] == first["c2"]  # held for every round: it waits for the asset's next event
    # c1 moved by the producer's own transaction, before its COMMIT; then the rounds after it,
    # each a transaction of its own, found c2 still held.
    statements = seen.normalized()
    locking = [n for n, s in enumerate(statements) if s.endswith("SKIP LOCKED")]
    moved = [
        n
        for n, s in enumerate(statements)
        if s.startswith("UPDATE asset_dag_run_queue") and "created_at <" in s
    ]
    assert len(commits) >= 2
    assert locking[0] < moved[0] < commits[0]
    assert moved == [moved[0]]  # c2 was never moved

    _emit(engine)  # nothing held: both rows move in the transaction, nothing after COMMIT
    newest = max(e.timestamp for e in events(engine))
    assert _created(engine) == {"c1": newest, "c2": newest}
