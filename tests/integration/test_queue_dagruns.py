"""``queue_dagruns``: the statement driven by asset ids (``source="assets"``), for callers without events."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import queue_dagruns
from airflow_adrq.models import AssetDagRunQueue
from tests.factories import (
    add_alias,
    add_asset,
    add_dags,
    asset_ref,
    link_aliases,
    queue_rows,
    schedule_on_alias,
    schedule_on_asset,
    schedule_on_name,
    schedule_on_uri,
)


def _graph(s):
    """Asset a: direct (one paused), by name, by URI, through an alias; asset b: direct."""
    add_dags(s, ["direct", "by_name", "by_uri", "by_alias", "paused"], paused=["paused"])
    a = add_asset(s, "a")
    b = add_asset(s, "b")
    schedule_on_asset(s, a, ["direct", "paused"])
    schedule_on_name(s, "a", ["by_name"])
    schedule_on_uri(s, asset_ref("a").uri, ["by_uri"])
    alias = add_alias(s, "al")
    link_aliases(s, [(alias, a)])
    schedule_on_alias(s, alias, ["by_alias"])
    schedule_on_asset(s, b, ["direct"])
    return a, b


def test_queues_direct_name_and_uri_consumers_not_aliases_nor_paused(engine, committed):
    a, b = committed(_graph)
    stamp = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with Session(engine) as session:
        queue_dagruns(session, [b, a, a], created_at=stamp)
        session.commit()
    rows = queue_rows(engine)
    # An alias counts only for events emitted through it; paused DAGs are not queued.
    assert set(rows) == {(a, "direct"), (a, "by_name"), (a, "by_uri"), (b, "direct")}
    assert {v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v for v in rows.values()} == {stamp}


def test_an_existing_row_moves_forwards_only(engine, committed):
    a, _ = committed(_graph)
    early = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    late = early + dt.timedelta(hours=1)
    for when in (early, late, early):
        with Session(engine) as session:
            queue_dagruns(session, [a], created_at=when, on_conflict="refresh")
            session.commit()
    with engine.connect() as conn:
        kept = conn.scalar(
            sa.select(sa.func.count())
            .where(AssetDagRunQueue.created_at == late)
            .select_from(AssetDagRunQueue)
        )
    assert kept == 3  # direct, by_name, by_uri


def test_bad_asset_ids_are_refused(engine):
    with Session(engine) as session:
        with pytest.raises(TypeError, match="asset ids must be ints"):
            queue_dagruns(session, ["1"])
        with pytest.raises(TypeError, match="asset ids must be ints"):
            queue_dagruns(session, [True])
        queue_dagruns(session, [])  # nothing to do
        session.commit()
    assert queue_rows(engine) == {}
