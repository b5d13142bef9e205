"""Producers through Airflow's own models (PostgreSQL, MariaDB): stock deadlocks, ours does not.

The negative control is forced, not left to timing (a flaky control reddens
CI): two producers register the same two assets in opposite orders through
Airflow's own ``register_asset_changes_in_db``, and each waits until the
other has registered its first asset (adrq_af_producer.run_forced). On
3.1-3.3 (queue keyed by ``(asset_id, target_dag_id)``) stock Airflow has then
inserted, and locked, the queue rows the other asks for next: every round
must deadlock, or the harness proves nothing. The plug-in, under the same
schedule, must not, and both leave exactly the expected rows. On 3.4 the
queue is keyed per event, so producers insert disjoint keys and stock has no
queue-row deadlock to catch: there the test checks that neither deadlocks
and that each writes one row per (event, consumer).

The 8-producer runs measure the two under the machine's own interleaving and
check the plug-in (0 deadlocks, exact rows); stock's count there is printed,
not asserted: whether it deadlocks depends on timing.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from tests.plugin import adrq_af_producer
from tests.plugin import adrq_af_scenario as scenario
from tests.plugin.adrq_af_scenario import LINE

PRODUCERS = 8
ROUNDS = 2
ASSETS = ["a0", "a1", "a2"]
CONSUMERS = [f"c{i:02d}" for i in range(6)]
HOLD_SECONDS = 0.005
DEADLINE_SECONDS = 300


#: The forced control: two producers, each registering both assets, in opposite orders.
FORCED_ROUNDS = 3
FORCED_ASSETS = ("a0", "a1")
FORCED_CONSUMERS = ("c00", "c01")
# Airflow registers a task's Asset outlets before its Asset.ref(name=...)
# outlets: producer 0 registers a0 then a1, producer 1 a1 then a0.
FORCED_OUTLETS = (
    (("a0", "Asset"), ("a1", "AssetNameRef")),
    (("a1", "Asset"), ("a0", "AssetNameRef")),
)
FORCED_ORDERS = tuple([name for name, _ in outlets] for outlets in FORCED_OUTLETS)
VARIANTS = ("stock", "adrq")


@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql", "mysql")
def test_forced_opposite_orders_stock_deadlocks_every_round_ours_never(af_engine, airflow_db):
    """Every round: stock deadlocks (3.1-3.3), the plug-in never does; both leave the exact rows."""
    assert FORCED_ORDERS[0] == FORCED_ORDERS[1][::-1], "the two producers' orders must be opposite"
    with Session(af_engine) as session:
        scenario.seed(
            session, assets=list(FORCED_ASSETS), consumers={a: FORCED_CONSUMERS for a in FORCED_ASSETS}
        )
    url = airflow_db.url.render_as_string(hide_password=False)

    ctx = multiprocessing.get_context("spawn")
    # step: the two producers and this process (which empties the queue before
    # a round and reads the rows after it); pause: the two producers, inside
    # the transaction, after each has registered its first asset.
    step = ctx.Barrier(len(FORCED_OUTLETS) + 1)
    pause = ctx.Barrier(len(FORCED_OUTLETS))
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=adrq_af_producer.run_forced,
            args=(index, url, VARIANTS, FORCED_ROUNDS, specs, HOLD_SECONDS, step, pause, results),
        )
        for index, specs in enumerate(FORCED_OUTLETS)
    ]
    for proc in procs:
        proc.start()

    rounds = []  # (variant, round, results by producer, snapshot after the round)
    failure = None
    try:
        for variant in VARIANTS:
            for round_no in range(FORCED_ROUNDS):
                with af_engine.begin() as conn:
                    conn.exec_driver_sql("DELETE FROM asset_dag_run_queue")
                # The first wait covers the producers' start (importing Airflow).
                step.wait(timeout=DEADLINE_SECONDS)
                step.wait(timeout=adrq_af_producer.STEP_TIMEOUT)
                got = sorted((results.get(timeout=30) for _ in procs), key=lambda r: r["index"])
                with af_engine.connect() as conn:
                    snap = scenario.snapshot(conn)
                rounds.append((variant, round_no, got, snap))
    except Exception as exc:  # a broken barrier, a missing result: report it with the exit codes
        failure = exc
        step.abort()
        pause.abort()
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    if failure is not None:
        pytest.fail(
            f"forced run stopped after {len(rounds)} round(s): {failure!r}; "
            f"producer exit codes {[proc.exitcode for proc in procs]}"
        )
    assert [proc.exitcode for proc in procs] == [0] * len(procs)

    counts = {
        v: [sum(r["deadlocks"] for r in got) for (var, _, got, _) in rounds if var == v] for v in VARIANTS
    }
    print(f"\n{airflow_db.backend}: forced opposite orders, deadlocks per round {counts}")

    event_count = 0
    for variant, round_no, got, snap in rounds:
        where = f"{variant} round {round_no}"
        # The schedule happened: each producer's first attempt registered the two
        # assets in its order (the order of Airflow's own calls, not ours).
        assert [r["attempts"][0] for r in got] == list(FORCED_ORDERS), where
        # ... and each transaction's last (committed) attempt registered both.
        assert [sorted(r["attempts"][-1]) for r in got] == [sorted(FORCED_ASSETS)] * len(got), where
        deadlocks = sum(r["deadlocks"] for r in got)
        if variant == "stock" and not LINE.shape.event_keyed:
            assert deadlocks >= 1, (
                f"{where}: the harness must catch the deadlock of Airflow's unsorted writes"
            )
        else:
            assert deadlocks == 0, f"{where}: {[r['deadlocks'] for r in got]}"
        assert [len(r["attempts"]) for r in got] == [1 + r["deadlocks"] for r in got], where

        # Exact rows: one event per (producer, asset) of this round, none left by
        # the deadlocked attempts; the rounds before kept theirs.
        run_id = f"{variant}-{round_no}"
        events = [e for e in snap["asset_event"] if e[4] == run_id]
        assert events == sorted(
            (
                (a, "{}", "producer", f"t{i}", run_id, -1, None)
                for i in range(len(got))
                for a in FORCED_ASSETS
            ),
            key=repr,
        ), where
        event_count += len(events)
        assert len(snap["asset_event"]) == event_count, where
        if LINE.shape.event_keyed:
            # 3.4: one row per (event, consumer).
            assert snap["asset_dag_run_queue_events"] == sorted(
                ((e[0], c, e) for e in events for c in FORCED_CONSUMERS), key=repr
            ), where
        else:
            assert snap["asset_dag_run_queue"] == sorted(
                (a, c) for a in FORCED_ASSETS for c in FORCED_CONSUMERS
            ), where


@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql", "mysql")
def test_eight_producers_ours_does_not_deadlock(af_engine, airflow_db):
    _eight_producers(af_engine, airflow_db, airflow_db.url.render_as_string(hide_password=False))


@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql")
def test_eight_producers_through_pgbouncer_transaction_pooling(af_engine, airflow_db, af_pgbouncer):
    """The same run with every producer connection through PgBouncer in transaction pooling mode."""
    url = sa.make_url(af_pgbouncer).set(database=airflow_db.url.database, drivername="postgresql+psycopg2")
    _eight_producers(af_engine, airflow_db, url.render_as_string(hide_password=False))


def _eight_producers(af_engine, airflow_db, url):
    with Session(af_engine) as session:
        scenario.seed(session, assets=ASSETS, consumers={a: CONSUMERS for a in ASSETS})

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PRODUCERS)
    results = ctx.Queue()
    procs = []
    saved_seed = os.environ.get("PYTHONHASHSEED")
    started = time.monotonic()
    try:
        for index in range(PRODUCERS):
            # Different hash seeds: as in production, every process iterates
            # Airflow's sets of assets in its own order.
            os.environ["PYTHONHASHSEED"] = str(1000 + index)
            proc = ctx.Process(
                target=adrq_af_producer.run,
                args=(index, url, ("stock", "adrq"), ROUNDS, ASSETS, HOLD_SECONDS, barrier, results),
            )
            proc.start()
            procs.append(proc)
    finally:
        if saved_seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved_seed

    collected = []
    # Generous: eight processes importing Airflow (3.4's is the heaviest) take
    # a minute of a loaded 2-core machine before the first round; a run
    # normally ends well before this, and only a hung producer reaches it.
    deadline = started + DEADLINE_SECONDS
    try:
        while len(collected) < 2 * PRODUCERS:
            collected.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
    except queue.Empty:
        pytest.fail(f"producers did not finish in {DEADLINE_SECONDS} s; got {collected}")
    finally:
        for proc in procs:
            proc.join(timeout=max(1.0, deadline + 30 - time.monotonic()))
            if proc.is_alive():
                proc.kill()
    elapsed = time.monotonic() - started

    deadlocks = {v: sum(d for (variant, _, d, _) in collected if variant == v) for v in ("stock", "adrq")}
    worst = {v: max(w for (variant, _, _, w) in collected if variant == v) for v in ("stock", "adrq")}
    print(f"\n{airflow_db.backend}: deadlocks {deadlocks}, worst transaction {worst}, {elapsed:.1f} s")
    assert [proc.exitcode for proc in procs] == [0] * PRODUCERS

    # Exact rows: every committed transaction left one event per outlet, the
    # replayed (deadlocked) attempts left nothing, and the last round queued
    # every (asset, consumer) pair once.
    with af_engine.connect() as conn:
        snap = scenario.snapshot(conn)
        per_variant = {
            v: conn.execute(
                sa.text("SELECT count(*) FROM asset_event WHERE source_run_id LIKE :p"), {"p": f"{v}-%"}
            ).scalar_one()
            for v in ("stock", "adrq")
        }
    assert per_variant == {
        "stock": PRODUCERS * ROUNDS * len(ASSETS),
        "adrq": PRODUCERS * ROUNDS * len(ASSETS),
    }
    pairs = Counter(snap["asset_dag_run_queue"])
    # 3.4: one row per (event, consumer), i.e. per producer of the last round.
    per_pair = PRODUCERS if LINE.shape.event_keyed else 1
    assert pairs == {(a, c): per_pair for a in ASSETS for c in CONSUMERS}

    # Stock's count depends on the interleaving here: the forced control
    # (test_forced_opposite_orders_...) is the one that must catch its deadlocks.
    assert deadlocks["adrq"] == 0
