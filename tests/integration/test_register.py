"""register_asset_change on every backend, mirroring Airflow's own tests
(airflow-core/tests/unit/assets/test_manager.py) plus what commit-time queueing adds."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import (
    AssetChange,
    add_listener,
    flush_queue,
    register_asset_change,
    register_asset_changes,
    remove_listener,
)
from airflow_adrq.deferral import pending_events
from airflow_adrq.models import AssetDagRunQueue, AssetEvent, UtcDateTime, utcnow
from tests.factories import (
    add_alias,
    add_asset,
    add_dags,
    alias_event_links,
    alias_links,
    asset_ref,
    events,
    queued,
    schedule_on_alias,
    schedule_on_asset,
    schedule_on_name,
    schedule_on_uri,
    stored_aliases,
    task_instance,
)


@pytest.fixture
def listener_calls():
    calls = []
    add_listener(calls.append)
    yield calls
    remove_listener(calls.append)


def test_queues_direct_references_and_skips_paused(engine, fan):
    asset_id = fan({"a": ["c1", "c2", "paused"]}, paused={"paused"})["a"]
    with Session(engine) as session:
        event = register_asset_change(
            task_instance=task_instance(), asset=asset_ref("a"), extra={"k": "v"}, session=session
        )
        session.commit()
        assert event.id is not None
    assert queued(engine) == {(asset_id, "c1"), (asset_id, "c2")}
    (stored,) = events(engine)
    assert (stored.asset_id, stored.extra) == (asset_id, {"k": "v"})
    assert (stored.source_dag_id, stored.source_task_id, stored.source_run_id, stored.source_map_index) == (
        "producer",
        "emit",
        "run-1",
        -1,
    )
    assert stored.partition_key is None
    assert stored.timestamp.tzinfo is not None


def test_queues_name_uri_and_alias_references(engine, committed):
    def build(s):
        add_dags(
            s, ["by_name", "by_uri", "by_alias", "by_other_alias", "paused_alias"], paused={"paused_alias"}
        )
        aid = add_asset(s, "a", "s3://b/a")
        schedule_on_name(s, "a", ["by_name"])
        schedule_on_uri(s, "s3://b/a", ["by_uri"])
        schedule_on_alias(s, add_alias(s, "al"), ["by_alias", "paused_alias"])
        schedule_on_alias(s, add_alias(s, "other"), ["by_other_alias"])
        return aid

    asset_id = committed(build)
    with Session(engine) as session:
        event = register_asset_change(
            asset=asset_ref("a", "s3://b/a"), source_alias_names=["al"], session=session
        )
        session.commit()
        event_id = event.id
    assert queued(engine) == {(asset_id, "by_name"), (asset_id, "by_uri"), (asset_id, "by_alias")}
    alias_id = stored_aliases(engine)["al"]
    assert alias_event_links(engine) == [(alias_id, event_id)]
    assert alias_links(engine) == [(alias_id, asset_id)]


def test_unknown_alias_is_created_and_linked(engine, committed):
    asset_id = committed(lambda s: add_asset(s, "a"))
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), source_alias_names=["new-alias"], session=session)
        session.commit()
    alias_id = stored_aliases(engine).get("new-alias")
    assert alias_id is not None
    assert alias_links(engine) == [(alias_id, asset_id)]


def test_duplicates_are_ignored_and_created_at_kept(engine, fan):
    asset_id = fan({"a": ["c"]})["a"]
    for _ in range(2):
        with Session(engine) as session:
            register_asset_change(asset=asset_ref("a"), session=session)
            register_asset_change(asset=asset_ref("a"), session=session)
            session.commit()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(AssetDagRunQueue.asset_id, AssetDagRunQueue.target_dag_id)).all()
    assert [tuple(r) for r in rows] == [(asset_id, "c")]
    assert len(events(engine)) == 4


def test_refresh_moves_created_at_forward_only(engine, fan):
    asset_id = fan({"a": ["c"]})["a"]

    def created_at():
        with Session(engine) as s:
            return s.scalar(
                sa.select(AssetDagRunQueue.created_at).where(AssetDagRunQueue.asset_id == asset_id)
            )

    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        session.commit()
    first = created_at()
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)  # the default, "auto"
        session.commit()
    # "auto" refreshes in the statement where Airflow's scheduler locks the
    # rows it consumes, after COMMIT where it does not (MariaDB).
    assert created_at() > first
    assert created_at() == max(e.timestamp for e in events(engine))
    first = created_at()
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, on_conflict="ignore")
        session.commit()
    assert created_at() == first  # "ignore" keeps the older timestamp (Airflow 3.3 behaviour)
    for policy in ("refresh", "refresh_after_commit"):
        with Session(engine) as session:
            register_asset_change(asset=asset_ref("a"), session=session, on_conflict=policy)
            session.commit()
        refreshed = created_at()
        assert refreshed > first, policy
        assert refreshed == max(e.timestamp for e in events(engine)), policy
        first = refreshed


def test_the_stamp_is_the_database_clock_at_commit(engine, fan):
    """One value on the event and its row, from the server's clock (SQLite: this host's), at the commit.

    That it is read after the rows are locked: tests/concurrency/test_stamp_order.py.
    """
    asset_id = fan({"a": ["c"]})["a"]
    clock = {"postgresql": "SELECT statement_timestamp()", "mysql": "SELECT UTC_TIMESTAMP(6)"}
    column = sa.Column("now", UtcDateTime())

    def now():
        if engine.dialect.name not in clock:
            return utcnow()
        with engine.connect() as conn:
            return conn.execute(sa.text(clock[engine.dialect.name]).columns(column)).scalar_one()

    with Session(engine, expire_on_commit=False) as session:
        event = register_asset_change(asset=asset_ref("a"), session=session)
        flushed = event.timestamp
        before = now()
        session.commit()
        after = now()
        loaded = event.timestamp
    (stored,) = events(engine)
    assert before <= stored.timestamp <= after
    assert stored.timestamp > flushed
    assert loaded == stored.timestamp  # the loaded object carries it too
    with Session(engine) as s:
        assert s.scalar(sa.select(AssetDagRunQueue.created_at)) == stored.timestamp
    assert asset_id


def test_unknown_asset_warns_and_writes_nothing(engine, caplog, listener_calls):
    with Session(engine) as session, caplog.at_level(logging.WARNING, logger="airflow_adrq.manager"):
        assert register_asset_change(asset=asset_ref("missing"), session=session) is None
        session.commit()
    assert events(engine) == []
    assert queued(engine) == set()
    assert listener_calls == []
    assert Counter(r.getMessage().split(" ")[0] for r in caplog.records) == {"AssetModel": 1}
    assert "not found; cannot create asset event" in caplog.records[0].getMessage()


def test_inactive_asset_warns_and_continues(engine, caplog, fan):
    asset_id = fan({"a": ["c"]}, active=False)["a"]
    with Session(engine) as session, caplog.at_level(logging.WARNING, logger="airflow_adrq.manager"):
        assert register_asset_change(asset=asset_ref("a"), session=session) is not None
        session.commit()
    assert [r.getMessage() for r in caplog.records] == [
        f"Emitting event for inactive AssetModel {asset_ref('a')}"
    ]
    assert queued(engine) == {(asset_id, "c")}


def test_partition_key_queues_no_non_partitioned_dag(engine, fan):
    asset_id = fan({"a": ["plain", "partitioned"]}, partitioned={"partitioned"})["a"]
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), partition_key="2026-11-29", session=session)
        session.commit()
        assert event.partition_key == "2026-11-29"
    assert queued(engine) == set()
    # Without a partition key the plain DAG is queued; a partitioned DAG never
    # goes to asset_dag_run_queue (Airflow sends it to asset_partition_dag_run).
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        session.commit()
    assert queued(engine) == {(asset_id, "plain")}


def test_unknown_keyword_arguments_are_ignored(engine, committed):
    committed(lambda s: add_asset(s, "a"))
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), session=session, timestamp="ignored", whatever=1)
        session.commit()
    assert event is not None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"asset": object()}, TypeError),
        ({"asset": asset_ref("a"), "extra": ["not", "a", "dict"]}, TypeError),
        ({"asset": asset_ref("a"), "source_alias_names": "one-string"}, TypeError),
        ({"asset": asset_ref("a"), "queue_mode": "sometime"}, ValueError),
        ({"asset": asset_ref("a"), "on_conflict": "replace"}, ValueError),
    ],
)
def test_bad_input_is_rejected_before_any_write(engine, kwargs, error, committed):
    committed(lambda s: add_asset(s, "a"))
    with Session(engine) as session, pytest.raises(error):
        register_asset_change(session=session, **kwargs)
    assert events(engine) == []


def test_listeners_run_after_commit_only(engine, listener_calls, committed):
    committed(lambda s: add_asset(s, "a"))
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        assert listener_calls == []  # not inside the transaction
        session.rollback()
    assert listener_calls == []  # and never for a rolled-back event
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), session=session, source_alias_names=["al"])
        session.flush()
        event_id = event.id
        session.commit()
    assert [(c.event_id, c.asset_name, c.source_alias_names) for c in listener_calls] == [
        (event_id, "a", ("al",))
    ]


def test_callback_sink_receives_the_listener_calls(engine, listener_calls, committed):
    committed(lambda s: add_asset(s, "a"))
    sink = []
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, callback_sink=sink)
        session.commit()
    assert listener_calls == []
    assert len(sink) == 1
    sink[0]()
    assert len(listener_calls) == 1


# --- commit-time queueing --------------------------------------------------


def test_rows_appear_at_commit_not_before(engine, fan):
    ids = fan({"a": ["c1", "c2"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        assert queued(session) == set()
        assert len(pending_events(session)) == 1
        session.commit()
    assert queued(engine) == {(ids["a"], "c1"), (ids["a"], "c2")}


def test_flush_queue_makes_rows_visible_in_the_transaction(engine, fan):
    ids = fan({"a": ["c1"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        flush_queue(session)
        assert queued(session) == {(ids["a"], "c1")}
        assert pending_events(session) == []
        session.commit()
    assert queued(engine) == {(ids["a"], "c1")}


def test_rollback_queues_nothing(engine, fan):
    fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        register_asset_change(asset=asset_ref("b"), session=session)
        session.rollback()
        # The session is reusable and has forgotten the rolled-back assets.
        session.commit()
    assert queued(engine) == set()
    assert events(engine) == []


def test_two_commits_queue_exactly_the_union(engine, fan):
    ids = fan({"a": ["c1", "shared"], "b": ["c2", "shared"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        session.commit()
        register_asset_change(asset=asset_ref("b"), session=session)
        session.commit()
    a, b = ids["a"], ids["b"]
    assert queued(engine) == {(a, "c1"), (a, "shared"), (b, "c2"), (b, "shared")}


def test_savepoint_rollback_drops_its_assets_and_release_keeps_them(engine, fan):
    ids = fan({"a": ["c1"], "b": ["c2"], "c": ["c3"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        with session.begin_nested():
            register_asset_change(asset=asset_ref("b"), session=session)
        nested = session.begin_nested()
        register_asset_change(asset=asset_ref("c"), session=session)
        inner = session.begin_nested()
        register_asset_change(asset=asset_ref("b"), session=session)
        inner.commit()
        nested.rollback()  # drops "c" and the released inner "b"
        session.commit()
    assert queued(engine) == {(ids["a"], "c1"), (ids["b"], "c2")}
    assert sorted(e.asset_id for e in events(engine)) == sorted([ids["a"], ids["b"]])


def test_flush_inside_rolled_back_savepoint_is_queued_again_at_commit(engine, fan):
    ids = fan({"a": ["c1"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session)
        nested = session.begin_nested()
        flush_queue(session)
        nested.rollback()  # the flushed rows are gone with the savepoint
        assert queued(session) == set()
        session.commit()
    assert queued(engine) == {(ids["a"], "c1")}


def test_batch_api_registers_every_change(engine, fan):
    ids = fan({"a": ["c1"], "b": ["c2"]})
    with Session(engine) as session:
        results = register_asset_changes(
            session=session,
            changes=[
                AssetChange(asset_ref("b")),
                AssetChange(asset_ref("missing")),
                AssetChange(asset_ref("a")),
            ],
            task_instance=task_instance(),
        )
        assert [r.asset_id if r else None for r in results] == [ids["b"], None, ids["a"]]
        session.commit()
    assert queued(engine) == {(ids["a"], "c1"), (ids["b"], "c2")}


def test_one_change_passed_twice_gets_two_events(engine, fan):
    """Results are by position: the same AssetChange twice is two events, each with its own result."""
    fan({"a": ["c1"]})
    change = AssetChange(asset_ref("a"))
    with Session(engine) as session:
        first, second = register_asset_changes(session=session, changes=[change, change])
        session.commit()
        assert first is not None and second is not None and first.id != second.id
    assert len(events(engine)) == 2


def test_immediate_mode_writes_before_commit(engine, fan):
    ids = fan({"a": ["c1"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, queue_mode="immediate")
        assert queued(session) == {(ids["a"], "c1")}
        assert pending_events(session) == []
        session.commit()


def test_hostile_strings_are_stored_verbatim(engine, backend, committed):
    # ids are utf8mb3 on MySQL (3-byte characters at most); names/URIs are
    # latin1 there, as in Airflow, so they stay within latin1.
    dag_ids = ["q'uote\"d; DROP TABLE dag;--", "ünï-çødé ✓ 中文", "x" * 250, "back\\slash%_"]
    name = "n'a\"me %s %(x)s " + "y" * 1400
    uri = "s3://b/" + "'" * 10 + "z" * 1000
    alias = "al'ias\"" + "w" * 1000
    extra = {"q'\"": "ünï ✓ \\ %s", "nested": {"list": [1, "two"]}}

    def build(s):
        add_dags(s, dag_ids)
        aid = add_asset(s, name, uri)
        schedule_on_asset(s, aid, dag_ids[:2])
        schedule_on_name(s, name, [dag_ids[2]])
        schedule_on_alias(s, add_alias(s, alias), [dag_ids[3]])
        return aid

    asset_id = committed(build)
    with Session(engine) as session:
        register_asset_change(
            task_instance=task_instance(dag_id=dag_ids[0], run_id=dag_ids[1]),
            asset=asset_ref(name, uri),
            source_alias_names=[alias],
            extra=extra,
            session=session,
        )
        session.commit()
    assert queued(engine) == {(asset_id, d) for d in dag_ids}
    (stored,) = events(engine)
    assert (stored.extra, stored.source_dag_id, stored.source_run_id) == (extra, dag_ids[0], dag_ids[1])
    assert list(stored_aliases(engine)) == [alias]


def test_event_rows_and_queue_rows_share_the_callers_transaction(engine, fan):
    fan({"a": ["c1"]})
    with Session(engine) as session:
        register_asset_change(asset=asset_ref("a"), session=session, queue_mode="immediate")
        session.rollback()
    with Session(engine) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(AssetEvent)) == 0
    assert queued(engine) == set()


def test_one_stamp_across_statements_past_the_parameter_limit(engine, monkeypatch, fan):
    """Past IDS_PER_STATEMENT events the write takes several statements, and still one clock reading."""
    from airflow_adrq import queue

    monkeypatch.setattr(queue, "IDS_PER_STATEMENT", 2)
    names = [f"a{i}" for i in range(5)]
    ids = fan({name: ["c"] for name in names})
    with Session(engine) as session:
        for name in names:
            register_asset_change(asset=asset_ref(name), session=session)
        session.commit()
    stamps = {e.timestamp for e in events(engine)}
    assert len(stamps) == 1
    with Session(engine) as s:
        rows = s.execute(sa.select(AssetDagRunQueue.asset_id, AssetDagRunQueue.created_at)).all()
    assert sorted(rows) == sorted((ids[name], *stamps) for name in names)
