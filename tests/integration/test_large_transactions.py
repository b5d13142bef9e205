"""No size limit: 10,000 assets, each through its own alias, in ONE transaction.

Every asset is emitted through its own alias; each alias has one consumer
DAG of its own, and one DAG is scheduled directly on all the assets. One
transaction registers all 10,000 events (``register_asset_changes``) and
commits: 10,000 events, 10,000 new alias links and alias-event rows, and
20,000 queue rows, exactly. A second test does the same with 1,000 separate
``register_asset_change`` calls in one transaction (a thousand deferrals
merged at COMMIT). Why it is here: a statement with one UNION branch per
aliased asset made SQLite refuse such a commit ("too many terms in compound
SELECT") from about 500 assets; the event-driven statement has four branches
whatever the size.

The graph is inserted set-based (Core executemany), so the setup takes a
second or two; the phases' durations are printed (``pytest -s``).
"""

from __future__ import annotations

import random
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import AssetChange, register_asset_change, register_asset_changes
from airflow_adrq.models import (
    AssetAliasModel,
    AssetEvent,
    alias_association_table,
    asset_alias_asset_event_association_table,
)
from tests.factories import add_aliases, add_assets, add_dags, add_schedule_refs, asset_ref, queued

N = 10_000
SHARED = "shared_direct"

pytestmark = pytest.mark.slow


def _name(i):
    return f"big_{i:05d}"


def _uri(i):
    return f"s3://big/{i:05d}"


def _alias(i):
    return f"big_alias_{i:05d}"


def _consumer(i):
    return f"alias_consumer_{i:05d}"


def _aliased_assets(s, n):
    """n assets, n aliases (one consumer DAG each), one DAG on all the assets; set-based."""
    add_dags(s, [SHARED, *(_consumer(i) for i in range(n))])
    asset_ids = add_assets(s, [(_name(i), _uri(i)) for i in range(n)])
    alias_ids = add_aliases(s, [_alias(i) for i in range(n)])
    add_schedule_refs(
        s,
        direct=[(asset_ids[(_name(i), _uri(i))], SHARED) for i in range(n)],
        by_alias=[(alias_ids[_alias(i)], _consumer(i)) for i in range(n)],
    )
    asset_of = {i: asset_ids[(_name(i), _uri(i))] for i in range(n)}
    alias_of = {i: alias_ids[_alias(i)] for i in range(n)}
    return asset_of, alias_of


def _alias_state(conn):
    return conn.execute(sa.select(sa.func.count(), sa.func.max(AssetAliasModel.id))).one()


def _register_all(engine, committed, n, *, one_call):
    """Register assets 0..n-1 (shuffled), each through its own alias, in ONE transaction.

    Returns (asset_of, alias_of, event_of, timings).
    """
    timings = {}
    t0 = time.perf_counter()
    asset_of, alias_of = committed(lambda s: _aliased_assets(s, n))
    timings["setup"] = time.perf_counter() - t0
    order = list(range(n))
    random.Random(8).shuffle(order)
    t0 = time.perf_counter()
    with Session(engine) as session:
        if one_call:
            changes = [
                AssetChange(asset=asset_ref(_name(i), _uri(i)), source_alias_names=[_alias(i)]) for i in order
            ]
            results = register_asset_changes(session=session, changes=changes)
        else:
            results = [
                register_asset_change(
                    asset=asset_ref(_name(i), _uri(i)), source_alias_names=[_alias(i)], session=session
                )
                for i in order
            ]
        event_of = {i: e.id for i, e in zip(order, results, strict=True)}
        timings["register"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        session.commit()
        timings["commit"] = time.perf_counter() - t0
    return asset_of, alias_of, event_of, timings


def _check_exact(engine, n, asset_of, alias_of, event_of):
    expected_rows = {(asset_of[i], SHARED) for i in range(n)} | {
        (asset_of[i], _consumer(i)) for i in range(n)
    }
    rows = queued(engine)
    assert len(rows) == 2 * n
    assert rows == expected_rows
    with engine.connect() as conn:
        stored_events = dict(conn.execute(sa.select(AssetEvent.id, AssetEvent.asset_id)).all())
        links = {tuple(r) for r in conn.execute(sa.select(alias_association_table))}
        alias_events = {tuple(r) for r in conn.execute(sa.select(asset_alias_asset_event_association_table))}
        aliases = _alias_state(conn)
    assert stored_events == {event_of[i]: asset_of[i] for i in range(n)}
    assert links == {(alias_of[i], asset_of[i]) for i in range(n)}
    assert alias_events == {(alias_of[i], event_of[i]) for i in range(n)}
    # The aliases all existed: none created, no id burned.
    assert tuple(aliases) == (n, max(alias_of.values()))


def test_ten_thousand_aliased_assets_in_one_transaction(engine, committed, backend):
    asset_of, alias_of, event_of, timings = _register_all(engine, committed, N, one_call=True)
    t0 = time.perf_counter()
    _check_exact(engine, N, asset_of, alias_of, event_of)
    timings["check"] = time.perf_counter() - t0
    print(f"\n{backend}, {N} assets in one call: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def test_a_thousand_separate_calls_in_one_transaction(engine, committed, backend):
    n = 1_000
    asset_of, alias_of, event_of, timings = _register_all(engine, committed, n, one_call=False)
    _check_exact(engine, n, asset_of, alias_of, event_of)
    print(f"\n{backend}, {n} calls: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
