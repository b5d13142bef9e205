"""A PostgreSQL producer's wait for a busy consumer row: as long as its holder, at most ``lock_wait_s``."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import create_engine, queue_events
from airflow_adrq.errors import LockWaitTimeoutError
from airflow_adrq.models import AssetEvent, DagModel
from tests.factories import add_asset, add_dags, queued, schedule_on_asset
from tests.support.locks import backend_id, blocked_by

_DAG = DagModel.__table__


@pytest.fixture
def world(db_url):
    engine = create_engine(db_url, pool_size=4)
    with Session(engine) as s:
        add_dags(s, ["d1", "d2"])
        asset_id = add_asset(s, "x")
        schedule_on_asset(s, asset_id, ["d1", "d2"])
        s.commit()
    yield engine, asset_id
    engine.dispose()


def _hold(conn: sa.Connection, dag_id: str) -> None:
    """What the DAG processor's ``find_orm_dags`` takes: ``FOR NO KEY UPDATE``."""
    conn.execute(sa.select(_DAG.c.dag_id).where(_DAG.c.dag_id == dag_id).with_for_update(key_share=True))


def _produce(engine: sa.Engine, asset_id: int, lock_wait_s: float, out: dict) -> None:
    """One producer: an event, its queue write, what ``lock_timeout`` reads after it, COMMIT."""
    try:
        with Session(engine) as s:
            out["backend"][0] = backend_id(s.connection())
            event = AssetEvent(asset_id=asset_id)
            s.add(event)
            s.flush()
            queue_events(s, [event], on_conflict="refresh", lock_wait_s=lock_wait_s)
            out["written_at"] = time.monotonic()
            out["lock_timeout"] = s.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar_one()
            s.commit()
    except BaseException as exc:
        out["error"] = exc


@pytest.mark.backends("postgresql")
def test_waits_for_the_holder_and_leaves_lock_timeout_as_it_found_it(world):
    engine, asset_id = world
    out: dict = {"backend": [None]}
    with engine.connect() as holder:
        _hold(holder, "d2")
        producer = threading.Thread(target=_produce, args=(engine, asset_id, 30.0, out), daemon=True)
        producer.start()
        assert blocked_by(engine, out["backend"], backend_id(holder), producer.is_alive)
        released_at = time.monotonic()
        holder.commit()
    producer.join(30)
    assert "error" not in out, out.get("error")
    assert out["written_at"] >= released_at  # it waited for the holder ...
    assert out["lock_timeout"] == "0"  # ... with a lock_timeout of its own, put back afterwards
    assert queued(engine) == {(asset_id, "d1"), (asset_id, "d2")}


@pytest.mark.backends("postgresql")
def test_a_holder_that_never_ends_fails_the_write_after_lock_wait_s(world):
    engine, asset_id = world
    out: dict = {"backend": [None]}
    with engine.connect() as holder:
        _hold(holder, "d1")
        started = time.monotonic()
        _produce(engine, asset_id, 0.5, out)
        waited = time.monotonic() - started
        holder.rollback()
    assert isinstance(out.get("error"), LockWaitTimeoutError), out.get("error")
    assert "'d1'" in str(out["error"]) and "lock_wait_s" in str(out["error"])
    assert waited < 20  # ended by lock_wait_s, not by the holder (which ends after it)
    assert queued(engine) == set()
