"""``airflow-adrq bench --airflow --db-cost``: what one task success costs PostgreSQL, small, end to end.

One run of the mode's command line on a throwaway PostgreSQL cluster with the mode's settings
(``dbcost.postgresql.SETTINGS``; without the server binaries the test skips, and fails under CI):
F = 1 and 8, both scenarios, one caller (2 successes) and 2 producers x 2. Asserted, per cell: every task
instance SUCCESS, one event each, the queue's rows exact; the figures agree where two ways read them
(XIDs: snapshot xmax and pg_control_checkpoint; MultiXacts: WAL records and pg_control_checkpoint); and
the figures the design fixes, exactly: stock takes 1 XID per success at one caller, the plug-in 2 (its
SAVEPOINT's subtransaction locks and writes), the COMMIT records list that subtransaction, no MultiXact
at one caller, the first success after the CHECKPOINT logs full-page images, the plug-in share-locks
every consumer's dag row even when its queue rows exist (queued), stock then locks none, and refreshes
those rows (a HOT update each). Timings are never asserted. Plus unit tests of the parsing.
"""

from __future__ import annotations

import contextlib
import json
from importlib.metadata import version

import pytest

from airflow_adrq_bench.airflow_mode import main
from airflow_adrq_bench.airflow_mode.dbcost import mariadb, postgresql, report, success
from airflow_adrq_testing import servers
from airflow_adrq_testing.pytest_plugin import skip_or_fail

pytestmark = pytest.mark.skipif(
    not version("apache-airflow-core").startswith("3.3."), reason="the db-cost mode runs on Airflow 3.3"
)

FANOUTS = (1, 8)
SUCCESSES = 2
PRODUCERS, TRANSACTIONS = 2, 2


# --- parsing (no database) -----------------------------------------------------------------


def test_lsn_bytes_spans_the_high_word():
    assert postgresql._lsn_bytes("0/FFFFFFF0", "1/10") == 0x20


def test_sums_count_multixacts_members_and_subtransactions():
    rec = postgresql._Record
    wal = [
        rec(7, "MultiXact", "CREATE_ID", 54, 0, 0, 0, "1 offset 1 nmembers 2: 727 (keysh) 728 (sh) "),
        rec(7, "Heap", "LOCK", 443, 384, 1, 16397, "off 1: xid 726: flags 0x00 LOCK_ONLY"),
        rec(7, "Transaction", "COMMIT", 46, 0, 0, 0, "2026-12-04 23:44:19.748286+00; subxacts: 726"),
        rec(9, "Transaction", "ABORT", 30, 0, 0, 0, "2026-12-04 23:44:19.8+00"),
    ]
    sums = postgresql._sums(wal)
    assert (sums["multixacts"], sums["multixact_members"]) == (1, 2)
    assert (sums["commits"], sums["committed_subxacts"], sums["aborts"]) == (1, 1, 1)
    assert (sums["wal_records"], sums["wal_fpi"], sums["wal_fpi_bytes"], sums["wal_xids"]) == (4, 1, 384, 2)


def test_labels_group_what_the_traces_show():
    fk = 'SELECT 1 FROM ONLY "public"."dag" x WHERE "dag_id" OPERATOR(pg_catalog.=) $1 FOR KEY SHARE OF x'
    assert report.label(fk) == "(nested FK check) SELECT ... dag FOR KEY SHARE"
    assert report.label("WITH ev AS (SELECT 1) UPDATE asset_event SET x = 1").startswith("plug-in:")
    assert success.statement_label("SAVEPOINT sa_savepoint_12") == "SAVEPOINT sa_savepoint_N"
    assert mariadb._table("`adrq_bench_x`.`asset_dag_run_queue`") == "asset_dag_run_queue"


# --- through Airflow, on a throwaway PostgreSQL cluster ----------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The raw JSON of one small run on a throwaway cluster of its own."""
    out = tmp_path_factory.mktemp("db-cost")
    with contextlib.ExitStack() as stack:
        try:
            info = stack.enter_context(servers.start_postgresql(postgresql.SETTINGS))
        except servers.ServerNotFoundError as exc:
            skip_or_fail(f"no throwaway PostgreSQL: {exc}")
        argv = ["--db-cost", "--db", info.url, "--out", str(out), "--fanouts", ",".join(map(str, FANOUTS))]
        argv += ["--successes", str(SUCCESSES), "--producers", str(PRODUCERS)]
        status = main([*argv, "--transactions", str(TRANSACTIONS)])
    text = (out / "airflow-db-cost.md").read_text()
    print(text)  # shown with -s or on failure
    raw = json.loads((out / "airflow-db-cost.json").read_text())
    assert status == 0, raw["problems"]
    return raw, text


def _cells(raw, **match):
    return [c for c in raw["cells"] if all(c[k] == v for k, v in match.items())]


@pytest.mark.slow
def test_every_cell_committed_its_successes_with_exact_rows(measured):
    raw, text = measured
    assert raw["problems"] == []
    assert len(raw["cells"]) == len(FANOUTS) * 2 * 2 * 2  # fan-outs x scenarios x callers x managers
    for cell in raw["cells"]:
        planned = SUCCESSES if cell["callers"] == 1 else PRODUCERS * TRANSACTIONS
        assert cell["planned"] == planned
        assert cell["checks"] == {
            "states": {"success": planned},
            "events": planned,
            "rows_exact": True,
            "rows": cell["fanout"] * (planned if cell["scenario"] == "new" else 1),
        }
    assert "### PostgreSQL" in text and "## Traces" in text


@pytest.mark.slow
def test_two_readings_of_xids_and_multixacts_agree(measured):
    raw, _ = measured
    for cell in raw["cells"]:
        totals, control = cell["totals"], cell["control"]
        assert totals["xids"] == control["next_xid"] == totals["wal_xids"]
        assert totals["multixacts"] == control["next_multixact_id"]
        # A fresh cluster's first MultiXact skips member offset 0 (invalid): one slot more there.
        assert control["next_multi_offset"] - totals["multixact_members"] in (0, 1)
        assert totals["wal_bytes"] >= totals["wal_record_bytes"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("manager", "xids"), [("stock", 1), ("plugin", 2)])
def test_one_caller_xids_per_success_are_exact(measured, manager, xids):
    raw, _ = measured
    for cell in _cells(raw, manager=manager, callers=1):
        assert [s["xids"] for s in cell["per_success"]] == [xids] * SUCCESSES
        assert cell["totals"]["commits"] == SUCCESSES
        assert cell["totals"]["committed_subxacts"] == (xids - 1) * SUCCESSES
        assert cell["totals"]["multixacts"] == 0  # nothing the parent locked is locked again below it
        assert cell["per_success"][0]["wal_fpi"] > 0  # the CHECKPOINT before the cell


@pytest.mark.slow
def test_what_each_manager_locks_and_writes_when_the_rows_are_queued(measured):
    raw, _ = measured
    f = max(FANOUTS)

    def records(cell, relation, kind):
        return sum(k["records"] for k in cell["wal"] if k["relation"] == relation and k["type"] == kind)

    for cell in _cells(raw, fanout=f, callers=1):
        n, plugin = SUCCESSES, cell["manager"] == "plugin"
        if cell["scenario"] == "new":  # both lock every consumer's dag row: FK check or FOR SHARE
            assert records(cell, "dag", "LOCK") == f * n
        else:  # the rows exist: stock's ON CONFLICT DO NOTHING writes nothing; the plug-in refreshes them
            assert records(cell, "dag", "LOCK") == (f * n if plugin else 0)
            assert records(cell, "asset_dag_run_queue", "HOT_UPDATE") == (f * n if plugin else 0)
        statements = [s for s in cell["statements"] if report.label(s["query"]).startswith("plug-in:")]
        assert bool(statements) == plugin


def test_the_airflow_mode_routes_db_cost(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--db-cost", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(option in out for option in ("--fanouts", "--successes", "--producers", "--scenario"))
    assert max(map(len, out.splitlines())) <= 100
