"""``airflow-adrq bench --airflow`` end to end, small, on SQLite; its verdict and its round's end.

One run of the Airflow mode (``airflow_adrq_bench.airflow_mode.main``) with
2 producers per manager: it must exit 0, print the verdict, write the JSON
and the Markdown, run each manager through the class its processes resolved
from ``[core] asset_manager_class``, and leave exactly the expected queue and
event rows after every plug-in call and round. Timings are printed, never asserted.

SQLite only, to stay under a minute on 2 cores: a server backend adds its own
``airflow db migrate`` (about 12 s of CPU) and rounds. The plug-in's
deadlock-freedom on PostgreSQL and MariaDB is tests/plugin/test_airflow_concurrency.py's.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode import main, report
from airflow_adrq_bench.airflow_mode.databases import (
    airflow_url,
    control_engine,
    end_transactions,
    refuse_airflow_database,
)
from airflow_adrq_bench.errors import BenchError

LINE = tuple(int(part) for part in version("apache-airflow-core").split(".")[:2])
pytestmark = pytest.mark.skipif(
    LINE not in ((3, 3), (3, 4)), reason=f"bench --airflow runs on Airflow 3.3 and 3.4, not {LINE}"
)

PRODUCERS = 2
TRANSACTIONS = 2
CLASSES = {
    "stock": "airflow.assets.manager.AssetManager",
    "sorted_loop": "airflow_adrq_bench.airflow_mode.sorted_loop.SortedLoopAssetManager",
    "plugin": "airflow_adrq.airflow.manager.AdrqAssetManager",
}
# sorted_loop is Airflow 3.3.2's manager with sorted rows: on 3.4, stock and the plug-in only.
if LINE != (3, 3):
    del CLASSES["sorted_loop"]


@pytest.mark.slow
def test_quick_run_prints_the_verdict_and_plugin_rows_are_exact(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "--backend",
        "sqlite",
        "--quick",
        "--producers",
        str(PRODUCERS),
        "--transactions",
        str(TRANSACTIONS),
    ]
    argv += ["--fanouts", "1,64", "--sweep-calls", "3", "--sweep-min-calls", "3", "--out", str(out)]
    for manager in CLASSES:
        argv += ["--manager", manager]
    status = main(argv)
    captured = capsys.readouterr()
    print(captured.out)  # shown with -s or on failure
    assert status == 0, captured.err[-3000:]

    # The terminal gets the verdict, within 100 columns; the file has the detail and the verdict.
    verdict = captured.out[captured.out.index("## Verdict") : captured.out.index("\ntook ")]
    assert max(map(len, verdict.splitlines())) <= 100
    assert "| sqlite " in verdict and "| MISSED" not in verdict and " 0 MISSED," in verdict
    detail = (out / "airflow-bench.md").read_text()
    assert "Legend" in detail and verdict.strip() in detail

    data = json.loads((out / "airflow-bench.json").read_text())
    names = [t["name"] for t in data["targets"]]
    assert names == ["sqlite"]
    assert {ln["what"] for ln in data["verdict"]} >= {"deadlocks", "transactions not committed"}

    # Every manager ran in processes that resolved its class from the config option.
    classes = {w["manager"]: w["class"] for w in data["workers"]}
    assert classes == CLASSES
    assert len(data["workers"]) == len(CLASSES) * PRODUCERS
    assert len({w["hash_seed"] for w in data["workers"]}) == PRODUCERS

    sweep = data["summary"]["sweep"]
    assert {(r["fanout"], r["manager"]) for r in sweep} == {(f, m) for f in (1, 64) for m in CLASSES}
    plugin_calls = [r for r in data["sweep"] if r["manager"] == "plugin"]
    assert plugin_calls and all(r["rows_exact"] for r in plugin_calls)

    rounds = [r for r in data["rounds"] if r["manager"] == "plugin"]
    assert {r["scenario"] for r in rounds} == {"single", "multi_outlet"}
    for rnd in rounds:
        assert rnd["rows_exact"], rnd["check"]
        assert rnd["committed"] == PRODUCERS * TRANSACTIONS
        outlets = 1 if rnd["scenario"] == "single" else data["sizes"]["outlets"]
        assert rnd["events"] == rnd["expected_events"] == rnd["committed"] * outlets
    plugin = [r for r in data["summary"]["contention"] if r["manager"] == "plugin"]
    assert [r["deadlocks"] for r in plugin] == [0, 0]


def _summary(plugin_ms, stock_ms, plugin_abandoned=0, sorted_abandoned=0):
    sweep = [
        {
            "db": "postgresql",
            "fanout": 1,
            "manager": m,
            "rows_exact": True,
            **dict(zip(("ci_low_ms", "p50_ms", "ci_high_ms"), ms, strict=True)),
        }
        for m, ms in (("plugin", plugin_ms), ("stock", stock_ms))
    ]
    contention = [
        {
            "db": "postgresql",
            "scenario": "single",
            "manager": m,
            "rows_exact": True,
            "deadlocks": 0,
            "abandoned": gave_up,
            "planned": 32,
            "tx_per_s": tx,
            "round_tx_per_s": [tx],
            **{"ci_low_ms": 9.0, "p50_ms": 10.0, "ci_high_ms": 11.0},
        }
        for m, gave_up, tx in (("plugin", plugin_abandoned, 300.0), ("sorted_loop", sorted_abandoned, 100.0))
    ]
    raw = {
        "targets": [{"name": "postgresql"}],
        "scenarios": ["single"],
        "sizes": {"fanouts": [1], "producers": 8, "fanout": 64, "hold_ms": 5.0},
    }
    return raw, {"sweep": sweep, "contention": contention}


def test_verdict_judges_spreads_and_unfinished_sides():
    lines = {ln.what: ln for ln in report.verdict(*_summary((4.0, 5.0, 6.0), (5.0, 6.0, 7.0)))}
    one = lines["one caller F=1 vs stock"]
    # The medians' intervals overlap and 1x is inside the ratio's range: no winner is claimed.
    assert (one.verdict, one.measured) == ("unclear", "1.20x (spreads overlap)")
    assert lines["tx/s single vs sorted"].measured == "3.00x (2.45-3.67x)"
    assert lines["deadlocks"].verdict == lines["queue rows exact throughout"].verdict == "met"

    # A side that did not finish gets no ratio: what did not finish instead.
    lines = {ln.what: ln for ln in report.verdict(*_summary((4, 5, 6), (9, 10, 11), sorted_abandoned=7))}
    assert lines["one caller F=1 vs stock"].measured == "2.00x (1.50-2.75x)"
    contention = lines["tx/s single vs sorted"]
    assert (contention.measured, contention.verdict) == ("sorted: 7 of 32 not committed", "met")
    lines = {ln.what: ln for ln in report.verdict(*_summary((4, 5, 6), (9, 10, 11), plugin_abandoned=1))}
    assert lines["tx/s single vs sorted"].verdict == "MISSED"
    assert lines["transactions not committed"].verdict == "MISSED"


@pytest.mark.backends("postgresql", "mysql")
def test_a_round_ends_the_transactions_left_open(fresh_db_url):
    engine, other = control_engine(fresh_db_url), sa.create_engine(fresh_db_url)
    try:
        with other.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            conn.commit()
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")  # left open
            assert end_transactions(engine) == 1
            with pytest.raises(sa.exc.DBAPIError):
                conn.exec_driver_sql("SELECT 1").scalar()
        assert end_transactions(engine) == 0
        with engine.connect() as conn:  # the row was rolled back
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0
    finally:
        engine.dispose()
        other.dispose()


def test_refuses_a_database_with_airflow_tables(tmp_path):
    metadata = tmp_path / "airflow.db"
    engine = sa.create_engine(f"sqlite:///{metadata}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dag (dag_id VARCHAR(250) PRIMARY KEY)")
    engine.dispose()
    with pytest.raises(BenchError, match=r"has Airflow tables \(dag\)"):
        refuse_airflow_database(f"sqlite:///{metadata}")
    assert main(["--db", f"sqlite:///{metadata}", "--out", str(tmp_path / "out")]) == 4  # could not run
    assert not (tmp_path / "out").exists()

    refuse_airflow_database(f"sqlite:///{tmp_path / 'absent.db'}")
    refuse_airflow_database("sqlite://")


def test_airflow_drivers():
    assert airflow_url("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert airflow_url("mysql://u@h/db") == "mysql+mysqldb://u@h/db"
    assert airflow_url("mariadb://u@h/db") == "mysql+mysqldb://u@h/db"
    assert airflow_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"


def test_abbreviations_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--qui"])
    assert exc.value.code == 2
    assert "airflow-adrq bench --airflow" in capsys.readouterr().err
