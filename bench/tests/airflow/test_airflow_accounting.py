"""``airflow-adrq bench --airflow --accounting``: events no run consumes, stock vs plug-in, through Airflow.

One bounded run of :func:`airflow_adrq_bench.airflow_mode.accounting.run` on
SQLite and PostgreSQL (one set of processes for both, one test per database:
without a PostgreSQL server its test skips, and fails under CI; 3 producers per manager
x 12 transactions, 3 consumer DAGs, a 30 ms hold; fan-out cells and fan-in cells, where each
producer emits an asset of its own and one DAG is scheduled on any of them), with Airflow 3.3.2's own
``SchedulerJobRunner._create_dagruns_for_dags`` as the consumer (two schedulers on PostgreSQL, one on
SQLite) and Airflow's other writers of the cells' ``dag`` rows beside them (``--dag-writers``). Asserted:

* the harness accounts for every committed event: the events in the database
  are the committed transactions, and each event (and each (event, consumer
  DAG) pair) is in exactly one of consumed / late / unconsumed; every consumer
  DAG consumed the sentinel; no queue row is left; no run consumed an event
  it should not know;
* the plug-in leaves no more events unconsumed than stock, per database and shape, and
  consumes no pair twice (the verdict);
* on SQLite, stock leaves some events unconsumed (an event's timestamp is
  taken before its INSERT waits for SQLite's write lock; another writer's
  queue rows, stamped later, commit first). Seen in every run so far (4 to 10
  of 36 at this size, 31 to 39 of 240 at the default size).

Not asserted: that stock loses events on PostgreSQL. At this size it lost 0,
0 and 1 of 36 in three runs (3 of 240 at the default size), so the count is
printed, not asserted. Plus unit tests of the classification.
"""

from __future__ import annotations

import contextlib
from importlib.metadata import version

import pytest

from airflow_adrq_bench.airflow_mode import accounting
from airflow_adrq_bench.airflow_mode import main as airflow_mode_main
from airflow_adrq_bench.airflow_mode.accounting import _merged, classify, event_to_run_ms, run, verdict
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN, AccountingSizes
from airflow_adrq_bench.airflow_mode.databases import describe
from airflow_adrq_testing import servers
from airflow_adrq_testing.pytest_plugin import skip_or_fail

# The consumer is Airflow 3.3's scheduler method.
pytestmark = pytest.mark.skipif(
    not version("apache-airflow-core").startswith("3.3."), reason="the accounting mode runs on Airflow 3.3"
)

SIZES = AccountingSizes(
    producers=3,
    transactions=12,
    consumers=3,
    holds_ms=(30.0,),
    budget_s=30.0,
    fan_in=True,
    schedulers=2,
    dag_writers=True,
)
DAGS = ["d0", "d1", "d2"]
#: Where the run measures; a database without a server is a skip, a failure under CI.
DATABASES = ("sqlite", "postgresql")
EVENT_TO_RUN_WHAT = "event COMMIT->run p99, 30 ms, fan-in"


# --- classification (no database) -----------------------------------------------------


def test_classify_each_pair_and_event_in_exactly_one_class():
    # Runs 1-6 before the sentinel (cutoff 6), runs 7-9 the sentinel's.
    consumed = [
        # event 10: every DAG before the sentinel -> consumed
        (1, "d0", 10),
        (2, "d1", 10),
        (3, "d2", 10),
        # event 11: d0 before, d1 only in the sentinel's run, d2 never -> unconsumed
        (1, "d0", 11),
        (8, "d1", 11),
        # event 12: d0 twice (a duplicate), d1 and d2 by the sentinel's runs -> late
        (4, "d0", 12),
        (5, "d0", 12),
        (8, "d1", 12),
        (9, "d2", 12),
        # event 13: nowhere -> unconsumed, in no run
        # the sentinel, by all three
        (7, "d0", 99),
        (8, "d1", 99),
        (9, "d2", 99),
        # another DAG's run (ignored) and an unknown event in a consumer DAG's run
        (6, "other", 10),
        (6, "d2", 55),
    ]
    c = classify([10, 11, 12, 13], DAGS, consumed, cutoff=6, sentinel=99)
    assert (c.events, c.consumed, c.late, c.unconsumed, c.in_no_run) == (4, 1, 1, 2, 1)
    assert (c.pairs, c.consumed_pairs, c.late_pairs, c.unconsumed_pairs) == (12, 5, 3, 4)
    assert c.duplicate_pairs == 1
    assert c.unknown == 1
    assert c.sentinel_consumers == 3
    assert c.classes_add_up


def test_classify_pair_consumed_before_and_after_the_sentinel_counts_as_consumed():
    c = classify([1], ["d0"], [(2, "d0", 1), (9, "d0", 1)], cutoff=5, sentinel=None)
    assert (c.consumed, c.late, c.unconsumed, c.duplicate_pairs, c.sentinel_consumers) == (1, 0, 0, 1, 0)


def test_verdict_flags_the_plugin_losing_more_than_stock():
    cells = [
        {"db": "x", "hold_ms": 30.0, "manager": "stock", "unconsumed": 2, "duplicate_pairs": 1},
        {"db": "x", "hold_ms": 30.0, "manager": "plugin", "unconsumed": 3, "duplicate_pairs": 0},
        {"db": "y", "hold_ms": 30.0, "manager": "stock", "unconsumed": 4, "duplicate_pairs": 0},
        {"db": "y", "hold_ms": 30.0, "manager": "plugin", "unconsumed": 0, "duplicate_pairs": 1},
    ]
    lines = {(ln.db, ln.what): (ln.measured, ln.verdict) for ln in verdict(cells)}
    assert lines == {
        ("x", "events unconsumed, vs stock, 30 ms"): ("3 vs 2", "MISSED"),
        ("x", "pairs consumed twice, 30 ms"): ("0", "met"),
        ("y", "events unconsumed, vs stock, 30 ms"): ("0 vs 4", "met"),
        ("y", "pairs consumed twice, 30 ms"): ("1", "MISSED"),
    }


def test_event_to_run_is_from_commit_to_the_end_of_the_pass_that_made_the_first_run():
    commits = {10: 100.0, 11: 100.5, 12: 101.0}
    consumed = [
        (1, "d0", 10),  # job 7's pass (100.2, 100.3): 300 ms
        (2, "d0", 10),  # a later run of the same pair: not the first
        (3, "d1", 11),  # job 8's pass (100.6, 100.9): 400 ms
        (9, "d0", 12),  # after the cutoff: not counted
        (4, "d1", 12),  # queued_at in no pass of its job: to queued_at (101.25), placed nowhere
        (5, "d0", 99),  # not a round's event
    ]
    runs = {1: (7, 100.25), 2: (7, 100.7), 3: (8, 100.8), 4: (8, 101.25), 9: (7, 102.0)}
    passes = {7: [(100.0, 100.1), (100.2, 100.3), (100.6, 100.75)], 8: [(100.6, 100.9), (101.0, 101.2)]}
    ms, unplaced = event_to_run_ms(commits, consumed, 5, runs, passes)
    assert [round(m) for m in ms] == [250, 300, 400] and unplaced == 1


def test_merged_schedulers_add_their_counts():
    one = {"passes": 3, "pass_p50_ms": 2.0, "pass_max_ms": 9.0, "failures": {"deadlock": 1}, "db_errors": {}}
    two = {"passes": 4, "pass_p50_ms": 3.0, "pass_max_ms": 5.0, "failures": {"deadlock": 2}, "db_errors": {}}
    one["drain"] = {"passes": 1, "failures": {}, "queue_rows_left": 0}
    two["drain"] = {"passes": 2, "failures": {"x": 1}, "queue_rows_left": 3}
    merged = _merged([one, two])
    assert (merged["passes"], merged["pass_max_ms"], merged["failures"]) == (7, 9.0, {"deadlock": 3})
    assert merged["drain"] == {"passes": 3, "failures": {"x": 1}, "queue_rows_left": 0}


def test_verdict_judges_the_plugins_failures_and_its_event_to_run_in_fan_in_to_one_dag():
    base = {
        "db": "x",
        "hold_ms": 5.0,
        "shape": "fan_in",
        "consumers": 1,
        "duplicate_pairs": 0,
        "unconsumed": 0,
    }
    cells = [
        base | {"manager": "stock", "producer_failures": {"deadlock": 4}, "run_p99_ms": 300.0},
        base | {"manager": "plugin", "producer_failures": {"deadlock": 1, "OSError": 1}, "run_p99_ms": 600.0},
    ]
    lines = {ln.what: (ln.measured, ln.verdict) for ln in verdict(cells)}
    assert lines["producer transactions failed (any error), 5 ms, fan-in"] == (
        "OSError 1, deadlock 1",
        "MISSED",
    )
    assert lines["event COMMIT->run p99, 5 ms, fan-in"] == ("600 ms (stock 300 ms)", "MISSED")
    cells[1] |= {"producer_failures": {}, "run_p99_ms": 500.0, "consumers": 64}
    lines = {ln.what: (ln.measured, ln.verdict) for ln in verdict(cells)}
    assert lines["producer transactions failed (any error), 5 ms, fan-in"] == ("0", "met")
    assert "event COMMIT->run p99, 5 ms, fan-in" not in lines  # not the fan-in to one DAG


def test_the_airflow_mode_routes_accounting(capsys):
    with pytest.raises(SystemExit) as exc:
        airflow_mode_main(["--accounting", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(
        option in out for option in ("--holds-ms", "--schedulers", "--fan-in-consumers", "--dag-writers")
    )


# --- through Airflow -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured():
    """One bounded run on SQLite and, where a server is found, PostgreSQL (one set of processes).

    Returns the raw results and, per database left out, why.
    """
    targets = [describe("sqlite://")]
    missing = {}
    with contextlib.ExitStack() as stack:
        try:
            info = stack.enter_context(servers.discover("postgresql"))
        except servers.ServerNotFoundError as exc:
            missing["postgresql"] = str(exc)
        else:
            targets.append(describe(info.url))
        raw = run(targets, SIZES)
    print(accounting.format_tables(raw))  # shown with -s or on failure
    assert {t.name for t in targets} | set(missing) == set(DATABASES)
    return raw, missing


@pytest.mark.slow
@pytest.mark.parametrize("db", DATABASES)
def test_stock_vs_plugin_through_airflows_scheduler(measured, db):
    raw, missing = measured
    if db in missing:
        skip_or_fail(f"{db} not measured: {missing[db]}")
    cells = {(c["shape"], c["manager"]): c for c in raw["cells"] if c["db"] == db}
    assert set(cells) == {(shape, m) for shape in ("fan_out", "fan_in") for m in STOCK_AND_PLUGIN}
    planned = SIZES.producers * SIZES.transactions
    for (shape, _), cell in cells.items():
        dags = SIZES.consumers if shape == "fan_out" else 1  # fan-in: one DAG on every producer's asset
        assert cell["problems"] == []
        assert cell["planned"] == planned
        assert cell["committed"] == cell["events"] == planned  # deadlocks are replayed
        assert cell["consumed"] + cell["late"] + cell["unconsumed"] == cell["events"]
        assert cell["consumed_pairs"] + cell["late_pairs"] + cell["unconsumed_pairs"] == cell["events"] * dags
        assert cell["in_no_run"] <= cell["unconsumed"]
        assert cell["unknown"] == 0
        assert cell["sentinel_consumers"] == dags
        assert cell["queue_rows_left"] == 0
        # The sentinel triggered one more run of every consumer DAG.
        assert cell["runs"] - cell["runs_before_sentinel"] == dags
        assert cell["runs_before_sentinel"] >= dags
        assert cell["schedulers"] == (1 if db == "sqlite" else 2)
        assert [w["kind"] for w in cell["writers"]] == ["dag_processor", "pause", "bulk"]
        assert all(w["writes"] >= 1 for w in cell["writers"])
        assert cell["run_pairs"] == cell["consumed_pairs"] and cell["runs_unplaced"] == 0

    # The event->run target is a speed target, judged by the mode, printed here (a loaded machine).
    judged = [ln for ln in verdict(raw["cells"]) if ln.db == db and ln.what != EVENT_TO_RUN_WHAT]
    assert [ln for ln in judged if ln.verdict != "met"] == []
    for shape in ("fan_out", "fan_in"):
        assert cells[(shape, "plugin")]["unconsumed"] <= cells[(shape, "stock")]["unconsumed"]
    if db == "sqlite":
        assert cells[("fan_out", "stock")]["unconsumed"] > 0
