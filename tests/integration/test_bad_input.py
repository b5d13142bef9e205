"""Bad and awkward input: a clear exception before any write, or Airflow's documented behaviour.

Each test is one line of the "Bad input" table in RELIABILITY.md.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import AssetChange, register_asset_change, register_asset_changes

# By name the four helpers every test here uses; the builders and readers used once, through the module.
from tests import factories
from tests.factories import asset_ref, events, queued, task_instance

#: The asset most tests register: ``a``, two consumer DAGs.
A = {"a": ["c1", "c2"]}


def _nothing_written(engine):
    assert events(engine) == [] and queued(engine) == set()


@pytest.mark.parametrize(
    "extra",
    [{"when": dt.datetime(2026, 1, 1)}, {"s": {1, 2}}, {"x": object()}, {"nan": float("nan")}, {1j: 1}],
    ids=["datetime", "set", "object", "nan", "complex-key"],
)
def test_extra_that_is_not_json_is_a_type_error_before_any_write(engine, extra, fan):
    fan(A)
    with Session(engine) as session:
        # An earlier registration in the same transaction is not disturbed.
        register_asset_change(asset=asset_ref("a"), session=session)
        with pytest.raises(TypeError, match="JSON-serialisable"):
            register_asset_change(asset=asset_ref("a"), extra=extra, session=session)
        session.commit()
    assert len(events(engine)) == 1 and len(queued(engine)) == 2


@pytest.mark.parametrize(
    "asset",
    [None, "a", ("a", "s3://bucket/a"), {"name": "a", "uri": "s3://bucket/a"}],
    ids=["none", "str", "tuple", "dict"],
)
def test_asset_of_the_wrong_type_is_a_type_error(engine, asset, fan):
    fan(A)
    with Session(engine) as session, pytest.raises(TypeError, match=r"name.*uri"):
        register_asset_change(asset=asset, session=session)
    _nothing_written(engine)


def test_unknown_asset_warns_and_returns_none(engine, caplog, fan):
    fan(A)
    with Session(engine) as session, caplog.at_level(logging.WARNING):
        assert register_asset_change(asset=asset_ref("nope"), session=session) is None
        session.commit()
    assert "not found; cannot create asset event" in caplog.text
    _nothing_written(engine)


def test_inactive_asset_warns_and_is_registered(engine, caplog, fan):
    fan({"gone": ["c1"]}, active=False)
    with Session(engine) as session, caplog.at_level(logging.WARNING):
        assert register_asset_change(asset=asset_ref("gone"), session=session) is not None
        session.commit()
    assert "inactive" in caplog.text
    assert len(queued(engine)) == 1


def test_duplicate_outlets_give_one_event_each_and_rows_once(engine, fan):
    asset_id = fan(A)["a"]
    with Session(engine) as session:
        results = register_asset_changes(
            session=session,
            changes=[AssetChange(asset_ref("a")), AssetChange(asset_ref("a"))],
        )
        assert len({e.id for e in results}) == 2
        session.commit()
    assert len(events(engine)) == 2
    assert queued(engine) == {(asset_id, "c1"), (asset_id, "c2")}


def test_partition_key_with_partitioned_and_plain_consumers_queues_nothing_here(engine, fan):
    # Airflow sends partitioned consumers to asset_partition_dag_run (its own
    # code; the plug-in keeps it) and queues no plain consumer for a keyed event.
    fan({"a": ["plain", "part"]}, partitioned={"part"})
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), partition_key="2026-01-01", session=session)
        session.commit()
        assert event.partition_key == "2026-01-01"
    assert queued(engine) == set()
    assert [e.partition_key for e in events(engine)] == ["2026-01-01"]


def test_ten_thousand_alias_names_on_one_event(engine, fan):
    names = [f"alias-{i:05d}" for i in range(10_000)]
    asset_id = fan({"a": ["c1"]})["a"]
    with Session(engine) as s:
        factories.add_dags(s, ["via-alias"])
        factories.schedule_on_alias(s, factories.add_alias(s, names[-1]), ["via-alias"])
        s.commit()
    with Session(engine) as session:
        event = register_asset_change(asset=asset_ref("a"), source_alias_names=names, session=session)
        session.commit()
        event_id = event.id
    assert queued(engine) == {(asset_id, "c1"), (asset_id, "via-alias")}
    aliases, links = factories.stored_aliases(engine), factories.alias_links(engine)
    event_links = factories.alias_event_links(engine)
    assert (len(aliases), len(links), len(event_links)) == (10_000, 10_000, 10_000)
    assert {e for _, e in event_links} == {event_id}


# Strings at the edges. Names and URIs are latin1 on MySQL and ids utf8mb3 (3
# bytes at most), as in Airflow; PostgreSQL text cannot hold NUL. Where the
# database refuses a value, it refuses it for Airflow's own code too: the
# caller gets the database error and the transaction writes nothing.
EDGE = {
    "quotes-and-percent": ("q'u\"o%te %s %(x)s \\", None),
    "max-length-name": ("n" * 1500, None),
    "4-byte-utf8": ("emoji \U0001f600", {"mysql"}),
    "nul": ("nul\x00byte", {"postgresql"}),
}


@pytest.mark.parametrize("case", sorted(EDGE))
def test_edge_strings_in_asset_names(engine, backend, case, fan):
    name, refused_by = EDGE[case]
    if refused_by and backend in refused_by:
        with Session(engine) as s, pytest.raises((sa.exc.DBAPIError, sa.exc.StatementError, ValueError)):
            factories.add_asset(s, name, "s3://edge")
        return
    asset_id = fan({name: ["c1", "c2"]}, uris={name: "s3://edge"})[name]
    with Session(engine) as session:
        register_asset_change(asset=asset_ref(name, "s3://edge"), session=session)
        session.commit()
    assert queued(engine) == {(asset_id, "c1"), (asset_id, "c2")}


@pytest.mark.parametrize("case", ["too-long-dag-id", "4-byte-utf8-dag-id"])
def test_source_ids_the_database_refuses_write_nothing(engine, backend, case, fan):
    dag_id = {"too-long-dag-id": "d" * 251, "4-byte-utf8-dag-id": "dag \U0001f600"}[case]
    refused = {"too-long-dag-id": {"postgresql", "mysql"}, "4-byte-utf8-dag-id": {"mysql"}}[case]
    fan(A)
    with Session(engine) as session:
        if backend in refused:
            with pytest.raises(sa.exc.DBAPIError):
                register_asset_change(
                    task_instance=task_instance(dag_id=dag_id),
                    asset=asset_ref("a"),
                    session=session,
                )
            session.rollback()
        else:  # SQLite does not enforce VARCHAR lengths or encodings
            register_asset_change(
                task_instance=task_instance(dag_id=dag_id),
                asset=asset_ref("a"),
                session=session,
            )
            session.commit()
    if backend in refused:
        _nothing_written(engine)
    else:
        assert [e.source_dag_id for e in events(engine)] == [dag_id]
