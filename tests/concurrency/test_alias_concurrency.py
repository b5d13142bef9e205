"""Aliases lock nothing they don't create, on PostgreSQL and MariaDB/MySQL.

8 producers (threads, each with its own connection) register two assets in
one transaction, asset ``x`` through alias ``a`` and asset ``y`` through alias
``b``, one ``register_asset_change`` call each, in opposite orders (half the
producers ``x`` first, half ``y`` first, reshuffled every round). The aliases
exist before the run. In rounds: all producers start together (a barrier),
hold their transaction open a little before COMMIT so that they overlap, and
retry the whole transaction after a deadlock (counted, classified by
:func:`airflow_adrq.retry.classify`). After each round the queue must hold
exactly the rows the round queued, and is emptied (so the next round inserts
fresh queue rows, the case in which producers contend); after the run the
events, alias-event rows and alias links must be exact and the ``asset_alias``
rows unchanged, with no ``asset_alias.id`` value burned.

The same harness runs "the old shape" (before aliases were written at commit: at
registration, a no-op upsert on ``asset_alias`` for each alias name and on
``asset_alias_asset`` for each link, in call order, locks held to COMMIT),
and must see it deadlock on MariaDB/MySQL, so that a harness unable to show a
deadlock fails instead of passing vacuously.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.orm import Session

from airflow_adrq import register_asset_change
from airflow_adrq.engine import create_engine
from airflow_adrq.models import (
    AssetAliasModel,
    AssetEvent,
    alias_association_table,
    asset_alias_asset_event_association_table,
    utcnow,
)
from airflow_adrq.retry import classify
from tests.factories import add_graph, alias_event_links, alias_links, asset_ref, link_aliases, queued

pytestmark = [pytest.mark.backends("postgresql", "mysql"), pytest.mark.slow]

PRODUCERS = 8
ROUNDS = 8
HOLD_S = 0.02
LOCK_TIMEOUT_S = 5
# Every round, each producer emits asset "x..." through alias "a" and asset
# "y..." through alias "b"; a DAG is scheduled on each alias, and one directly
# on every asset.
ALIASES = ("a", "b")
ON_ALIAS = {"a": "on_a", "b": "on_b"}
DIRECT = "direct"

_LOCK_TIMEOUT = {
    "postgresql": f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'",
    "mysql": f"SET SESSION innodb_lock_wait_timeout = {LOCK_TIMEOUT_S}",
}


# --- setup ---------------------------------------------------------------------


@dataclass
class World:
    asset_ids: dict  # asset name -> id
    alias_ids: dict  # "a"/"b" -> alias id
    per_round: bool  # fresh assets every round (their links do not exist yet)

    def calls(self, round_no):
        """The round's (asset name, alias name) pairs, x-first order."""
        suffix = str(round_no) if self.per_round else ""
        return [(f"x{suffix}", "a"), (f"y{suffix}", "b")]

    def queue_rows(self, round_no):
        """The queue rows a committed producer transaction of the round stands for."""
        return {
            row
            for asset, alias in self.calls(round_no)
            for row in ((self.asset_ids[asset], DIRECT), (self.asset_ids[asset], ON_ALIAS[alias]))
        }

    def route_of(self):
        """asset id -> the id of the alias its events go through."""
        return {
            self.asset_ids[asset]: self.alias_ids[alias]
            for r in range(ROUNDS)
            for asset, alias in self.calls(r)
        }


def _world(s, *, links_exist: bool) -> World:
    """Aliases a, b (with their DAGs); assets x, y with links (links_exist), or x0.., y0.. without."""
    names = ["x", "y"] if links_exist else [f"{k}{r}" for r in range(ROUNDS) for k in "xy"]
    keys = {n: (n, asset_ref(n).uri) for n in names}
    ids, alias_ids = add_graph(
        s,
        dags=[DIRECT, *ON_ALIAS.values()],
        assets=keys.values(),
        aliases=ALIASES,
        direct=[(k, DIRECT) for k in keys.values()],
        by_alias=ON_ALIAS.items(),
    )
    world = World({n: ids[k] for n, k in keys.items()}, alias_ids, per_round=not links_exist)
    if links_exist:
        link_aliases(s, sorted((alias_ids[a], world.asset_ids[n]) for n, a in world.calls(0)))
    return world


def _engine(db_url, backend):
    """Pooled (one connection per producer), lock waits bounded so a round cannot hang."""
    engine = create_engine(db_url, pool_size=PRODUCERS, max_overflow=2)
    statement = _LOCK_TIMEOUT[backend]

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute(statement)
        cursor.close()
        dbapi_connection.commit()

    return engine


# --- the two shapes ----------------------------------------------------------------


def library_shape(session, calls, world):
    """Through the public API: one register_asset_change per (asset, alias), in call order."""
    for asset, alias in calls:
        register_asset_change(asset=asset_ref(asset), source_alias_names=[alias], session=session)


def todays_shape(session, calls, world):
    """The pre-rewrite alias writes (test-only copy), in call order, locks held to COMMIT.

    Per call: a no-op upsert of the alias row by name (MySQL ``ON DUPLICATE
    KEY UPDATE id = id``, which takes an exclusive lock on the existing row;
    PostgreSQL ``ON CONFLICT DO NOTHING``, which takes no lock on a committed
    row), the same for the asset-alias link, then the event and its
    alias-event row. No queueing: the deadlocks shown are the aliases' own.
    """
    dialect = session.get_bind().dialect.name
    alias = AssetAliasModel.__table__
    for asset, name in calls:
        asset_id = world.asset_ids[asset]
        if dialect == "postgresql":
            alias_upsert = postgresql.insert(alias).on_conflict_do_nothing()
            link_upsert = postgresql.insert(alias_association_table).on_conflict_do_nothing()
        else:
            alias_upsert = mysql.insert(alias)
            alias_upsert = alias_upsert.on_duplicate_key_update(id=alias.c.id)
            link_upsert = mysql.insert(alias_association_table)
            link_upsert = link_upsert.on_duplicate_key_update(alias_id=alias_association_table.c.alias_id)
        session.execute(alias_upsert.values(name=name, group=""))
        alias_id = session.scalar(sa.select(alias.c.id).where(alias.c.name == name))
        session.execute(link_upsert.values(alias_id=alias_id, asset_id=asset_id))
        event_id = session.execute(
            sa.insert(AssetEvent.__table__).values(asset_id=asset_id, extra={}, timestamp=utcnow())
        ).inserted_primary_key[0]
        session.execute(
            sa.insert(asset_alias_asset_event_association_table).values(alias_id=alias_id, event_id=event_id)
        )


# --- the harness ---------------------------------------------------------------------


@dataclass
class Outcome:
    committed: int = 0
    gave_up: int = 0
    failures: Counter = field(default_factory=Counter)
    # One (unexpected, missing) pair of queue-row sets per round.
    queue_checks: list = field(default_factory=list)
    rounds: int = 0

    @property
    def deadlocks(self) -> int:
        return self.failures["deadlock"]


def run_rounds(engine, world, shape, *, rounds=ROUNDS, expect_queue=True, stop_after_deadlock=False, seed=0):
    """Run ``rounds`` rounds of PRODUCERS concurrent transactions of ``shape``."""
    outcome = Outcome()
    lock = threading.Lock()
    stop = threading.Event()
    errors: list = []
    round_committed = [0]

    def end_of_round():
        # Runs once, in one thread, when every producer has finished its transaction.
        rows = queued(engine)
        expected = world.queue_rows(outcome.rounds) if (expect_queue and round_committed[0]) else set()
        outcome.queue_checks.append((rows - expected, expected - rows))
        outcome.rounds += 1
        round_committed[0] = 0
        if stop_after_deadlock and outcome.deadlocks:
            stop.set()
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM asset_dag_run_queue"))

    start = threading.Barrier(PRODUCERS, timeout=120)
    end = threading.Barrier(PRODUCERS, action=end_of_round, timeout=120)
    orders = random.Random(seed)
    # Per round: half the producers (reshuffled) go x-then-y, the others y-then-x.
    plans = []
    for r in range(rounds):
        forward = set(orders.sample(range(PRODUCERS), PRODUCERS // 2))
        calls = world.calls(r)
        plans.append([calls if p in forward else calls[::-1] for p in range(PRODUCERS)])

    def transaction(calls, rng):
        for attempt in range(1, 21):
            try:
                with Session(engine) as session:
                    shape(session, calls, world)
                    time.sleep(HOLD_S)
                    session.commit()
                return True
            except Exception as exc:
                found = classify(exc)
                if found is None:
                    raise
                with lock:
                    outcome.failures[found.kind.value] += 1
                if stop_after_deadlock and found.kind.value == "deadlock":
                    return False
                time.sleep(rng.uniform(0, 0.005 * attempt))
        return False

    def body(p):
        rng = random.Random(seed * 100 + p)
        try:
            for r in range(rounds):
                start.wait()
                if stop.is_set():
                    return
                ok = transaction(plans[r][p], rng)
                with lock:
                    if ok:
                        outcome.committed += 1
                        round_committed[0] += 1
                    else:
                        outcome.gave_up += 1
                end.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)
            start.abort()
            end.abort()

    threads = [threading.Thread(target=body, args=(p,)) for p in range(PRODUCERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a producer thread did not finish"
    return outcome


# --- checks -------------------------------------------------------------------------


def _aliases(engine):
    with engine.connect() as conn:
        return {tuple(r) for r in conn.execute(sa.select(AssetAliasModel.id, AssetAliasModel.name))}


def _next_alias_id(engine):
    """The id the next asset_alias row gets (shows values burned by upserts); the probe row is removed."""
    with engine.begin() as conn:
        new_id = conn.execute(
            sa.insert(AssetAliasModel.__table__).values(name="probe", group="")
        ).inserted_primary_key[0]
        conn.execute(sa.delete(AssetAliasModel.__table__).where(AssetAliasModel.id == new_id))
    return new_id


def _check_rows(engine, world, outcome, *, aliases_before):
    """Events, alias-event rows and links exact for the committed transactions; aliases unchanged."""
    with engine.connect() as conn:
        event_assets = dict(conn.execute(sa.select(AssetEvent.id, AssetEvent.asset_id)).all())
        alias_events = set(alias_event_links(conn))
        links = set(alias_links(conn))
    route_of = world.route_of()
    # Each committed transaction: one event for each of its round's two assets.
    assert len(event_assets) == 2 * outcome.committed
    assert set(event_assets.values()) <= set(route_of)
    assert alias_events == {(route_of[asset_id], e) for e, asset_id in event_assets.items()}
    # Links: the pre-existing ones, or those of the assets emitted.
    linked_assets = set(event_assets.values()) if world.per_round else set(route_of)
    assert links == {(route_of[a], a) for a in linked_assets}
    assert _aliases(engine) == aliases_before


# --- the tests ----------------------------------------------------------------------


@pytest.mark.parametrize("links_exist", [True, False], ids=["links-exist", "links-missing"])
def test_aliases_in_opposite_orders_never_deadlock(backend, db_url, committed, links_exist):
    """Through register_asset_change: 0 deadlocks, exact rows, no asset_alias row or id touched.

    links-exist: the asset-alias links exist too (the steady state, the
    issue's scenario). links-missing: every round emits two fresh assets, so
    the producers race to create the same two missing links in opposite
    orders (the first emission of an asset through an alias).
    """
    engine = _engine(db_url, backend)
    try:
        world = committed(lambda s: _world(s, links_exist=links_exist))
        aliases_before = _aliases(engine)
        next_id_before = max(i for i, _ in aliases_before) + 1
        # Stops at the first deadlock (the test has failed then; on PostgreSQL
        # each deadlock costs deadlock_timeout, 1 s by default).
        outcome = run_rounds(engine, world, library_shape, stop_after_deadlock=True, seed=1)
        assert outcome.failures == Counter(), f"round {outcome.rounds}: {dict(outcome.failures)}"
        assert outcome.committed == PRODUCERS * ROUNDS
        assert outcome.queue_checks == [(set(), set())] * ROUNDS
        _check_rows(engine, world, outcome, aliases_before=aliases_before)
        # No alias id burned: the next alias still gets max(id) + 1.
        assert _next_alias_id(engine) == next_id_before
    finally:
        engine.dispose()


def test_same_harness_catches_todays_shape(backend, db_url, committed):
    """The pre-rewrite shape deadlocks on MariaDB/MySQL in this harness.

    On InnoDB the no-op ``ON DUPLICATE KEY UPDATE`` takes an exclusive lock on
    the existing ``a`` / ``b`` rows and holds it to COMMIT, in call order: two
    producers in opposite orders deadlock. On PostgreSQL ``ON CONFLICT DO
    NOTHING`` takes no lock on a committed conflicting row, so the same shape
    is NOT expected to deadlock there: only MariaDB/MySQL is asserted to.
    """
    engine = _engine(db_url, backend)
    try:
        world = committed(lambda s: _world(s, links_exist=True))
        aliases_before = _aliases(engine)
        outcome = run_rounds(
            engine, world, todays_shape, expect_queue=False, stop_after_deadlock=True, rounds=ROUNDS, seed=2
        )
        if backend == "mysql":
            assert outcome.deadlocks > 0, f"no deadlock in {outcome.rounds} rounds: {dict(outcome.failures)}"
        # Whatever committed left exact rows (no queue rows in this shape).
        assert outcome.queue_checks == [(set(), set())] * outcome.rounds
        _check_rows(engine, world, outcome, aliases_before=aliases_before)
    finally:
        engine.dispose()
