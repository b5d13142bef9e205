# mypy: ignore-errors
"""8 producers through Airflow's own models (PostgreSQL, MariaDB): stock deadlocks, ours does not.

On 3.1-3.3 (queue keyed by ``(asset_id, target_dag_id)``) stock Airflow's
unsorted writes must deadlock in this harness, or the harness proves
nothing. On 3.4 the queue is keyed per event, so producers insert disjoint
keys and stock has no queue-row deadlock to catch: there the test checks
that the plug-in has none either and writes one row per (event, consumer).
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


@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql", "mysql")
def test_eight_producers_stock_deadlocks_ours_does_not(af_engine, airflow_db):
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

    if not LINE.shape.event_keyed:
        assert deadlocks["stock"] > 0, "the harness must catch the deadlocks of Airflow's unsorted writes"
    assert deadlocks["adrq"] == 0
