"""One order for every writer of ours: the database's collation, never Python's code-point sort.

On a PostgreSQL database whose default collation is ICU ``en-US``, dag ids
such as ``aB`` and ``a_b`` sort differently than in Python. A writer that
sorts in Python and one that lets the database ``ORDER BY`` would lock the
same queue rows in different orders. Every writer of ours (the library's
``register_asset_change``, the plug-in's path through ``defer_events``, and
the multi-team variant with allowed pairs) uses the database's order; this
reads the physical insertion order back (``ctid`` of a fresh heap) to show it.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from airflow_adrq import create_engine, defer_events, queue_events, register_asset_change
from airflow_adrq.models import AssetEvent, metadata
from tests.factories import add_scheduled_assets, asset_ref

DAG_IDS = ["A", "a_b", "a-c", "ab", "aB", "Ab", "b", "B_2", "b-1"]


@pytest.fixture
def icu_engine(backend, _worker_databases):
    server_url = _worker_databases.server_url(backend)
    name = _worker_databases.new_name("icu")
    admin = sa.create_engine(server_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(
            f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING UTF8 '
            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
    engine = create_engine(sa.make_url(server_url).set(database=name))
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


def _collation_order(engine):
    with engine.connect() as conn:
        return [d for (d,) in conn.exec_driver_sql("SELECT dag_id FROM dag ORDER BY dag_id")]


@pytest.mark.backends("postgresql")
def test_every_writer_inserts_in_the_database_collation_order(icu_engine):
    with Session(icu_engine) as s:
        asset_id = add_scheduled_assets(s, {"x": DAG_IDS})["x"]
        s.commit()
    collated = _collation_order(icu_engine)
    # The premise, so the test can fail: ICU's order is not Python's.
    assert collated != sorted(DAG_IDS), collated
    assert sorted(collated) == sorted(DAG_IDS)

    orders = {}
    # 1. The library: register_asset_change, queued at COMMIT.
    with Session(icu_engine) as session:
        register_asset_change(asset=asset_ref("x"), session=session)
        session.commit()
    orders["library"] = _fresh_order(icu_engine)

    def flushed_event_then(write):
        """The insertion order when ``write`` queues an ORM-flushed event, as Airflow's code hands it over."""
        with Session(icu_engine) as session:
            event = AssetEvent(asset_id=asset_id, extra={})
            session.add(event)
            session.flush()
            write(session, event)
            session.commit()
        return _fresh_order(icu_engine)

    # 2. The plug-in's path: the event handed to defer_events.
    orders["plug-in"] = flushed_event_then(lambda session, event: defer_events(session, [event]))
    # 3. The multi-team variant: the same statement restricted to allowed pairs.
    orders["allowed pairs"] = flushed_event_then(
        lambda session, event: queue_events(session, [event], allowed={event.id: DAG_IDS})
    )

    assert orders == {writer: collated for writer in orders}


def _fresh_order(engine):
    """Insertion order of the queue rows (ctid on a table that was empty), then empty it again.

    TRUNCATE gives the next writer a new, empty heap, so ctid order is insertion order.
    """
    with engine.begin() as conn:
        order = [
            d for (d,) in conn.exec_driver_sql("SELECT target_dag_id FROM asset_dag_run_queue ORDER BY ctid")
        ]
        conn.exec_driver_sql("TRUNCATE asset_dag_run_queue")
    return order
