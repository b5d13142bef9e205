"""Regression: one INSERT into asset_dag_run_queue per call / per transaction, whatever the fan-out."""

from __future__ import annotations

import re

import pytest
from sqlalchemy.orm import Session

from airflow_adrq import AssetChange, register_asset_change, register_asset_changes
from airflow_adrq_testing.recording import recorded
from tests.factories import asset_ref, queued

_SAVEPOINT = re.compile(r"\bSAVEPOINT\b", re.IGNORECASE)
#: The one SAVEPOINT a queue write takes on PostgreSQL (its share locks never wait while held).
_SHARE_LOCK_SAVEPOINT = "SAVEPOINT adrq_share_lock"


def _savepoints(statements, writes: int, dialect: str) -> list[str]:
    """The SAVEPOINTs other than one share-lock SAVEPOINT per queue write on PostgreSQL (none expected)."""
    found = [s for s in statements if _SAVEPOINT.search(s)]
    ours = [s for s in found if s == _SHARE_LOCK_SAVEPOINT]
    assert len(ours) == (writes if dialect == "postgresql" else 0), found
    return [s for s in found if s != _SHARE_LOCK_SAVEPOINT]


def _dags(fanout):
    """The consumer DAGs of every asset of a test: ``fanout`` of them."""
    return [f"dag_{i:05d}" for i in range(fanout)]


@pytest.mark.parametrize("fanout", [1, 300])
def test_commit_mode_one_insert_per_transaction(engine, fan, fanout):
    dag_ids = _dags(fanout)
    ids = fan(dict.fromkeys("abc", dag_ids))
    with recorded(engine) as seen, Session(engine) as session:
        for name in ("c", "a", "b"):  # a multi-outlet task, outlets in arbitrary order
            register_asset_change(asset=asset_ref(name), session=session, source_alias_names=["al"])
        assert seen.queue_inserts() == []
        session.commit()
    inserts = seen.queue_inserts()
    assert len(inserts) == 1, inserts
    statement, parameters, executemany = inserts[0]
    assert not executemany
    assert "ORDER BY" in statement.upper()
    # Parameters do not grow with the fan-out: the 3 asset ids (repeated in the
    # direct/name/uri branches by positional-parameter drivers: 9), one alias
    # branch per asset (its id and alias name: 6), and the timestamp (1).
    assert len(parameters) <= 16
    assert not _savepoints(seen.statements, 1, engine.dialect.name)
    assert queued(engine) == {(i, d) for i in ids.values() for d in dag_ids}


@pytest.mark.parametrize("fanout", [1, 300])
def test_immediate_mode_one_insert_per_call(engine, fan, fanout):
    fan(dict.fromkeys("abc", _dags(fanout)))
    with recorded(engine) as seen, Session(engine) as session:
        for name in ("c", "a"):
            register_asset_change(asset=asset_ref(name), session=session, queue_mode="immediate")
        assert len(seen.queue_inserts()) == 2
        session.commit()
    assert len(seen.queue_inserts()) == 2
    assert not _savepoints(seen.statements, 2, engine.dialect.name)


def test_batch_api_one_insert(engine, fan):
    fan(dict.fromkeys("abc", _dags(50)))
    with recorded(engine) as seen, Session(engine) as session:
        register_asset_changes(
            session=session,
            changes=[AssetChange(asset_ref(n)) for n in ("b", "a", "c")],
            queue_mode="immediate",
        )
        session.commit()
    assert len(seen.queue_inserts()) == 1


@pytest.mark.slow
def test_fanout_10000_in_one_call(engine, fan):
    dag_ids = _dags(10_000)
    ids = fan({"wide": dag_ids})
    with recorded(engine) as seen, Session(engine) as session:
        register_asset_change(asset=asset_ref("wide"), session=session)
        session.commit()
    (insert,) = seen.queue_inserts()
    assert len(insert[1]) < 10
    rows = queued(engine)
    assert len(rows) == 10_000
    assert rows == {(ids["wide"], d) for d in dag_ids}
