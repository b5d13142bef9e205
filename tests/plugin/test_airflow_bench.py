"""``airflow-adrq bench --airflow`` end to end, small, on SQLite.

One run of the Airflow mode (``airflow_adrq_bench.airflow_mode.main``) with
2 producers per manager: it must exit 0, write the JSON, the Markdown and the
PNG, run each manager through the class its processes resolved from ``[core]
asset_manager_class``, and leave exactly the expected queue and event rows
after every plug-in call and round. Timings are printed, never asserted.

SQLite only, to stay under a minute on 2 cores: a server backend adds its own
``airflow db migrate`` (about 12 s of CPU) and rounds. The plug-in's
deadlock-freedom on PostgreSQL and MariaDB is test_airflow_concurrency.py's.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode import main, run
from tests.plugin.adrq_af_scenario import LINE

PRODUCERS = 2
TRANSACTIONS = 2
CLASSES = {
    "stock": "airflow.assets.manager.AssetManager",
    "sorted_loop": "airflow_adrq_bench.airflow_mode.sorted_loop.SortedLoopAssetManager",
    "plugin": "airflow_adrq.airflow.manager.AdrqAssetManager",
}
# sorted_loop is Airflow 3.3.2's manager with sorted rows: on 3.4, stock and the plug-in only.
if LINE.line != (3, 3):
    del CLASSES["sorted_loop"]


@pytest.mark.slow
def test_quick_run_writes_reports_and_plugin_rows_are_exact(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "--backend",
        "sqlite",
        "--quick",
        "--producers",
        str(PRODUCERS),
        "--transactions",
        str(TRANSACTIONS),
        "--fanouts",
        "1,64",
        "--sweep-calls",
        "3",
        "--sweep-min-calls",
        "3",
        "--out",
        str(out),
    ]
    for manager in CLASSES:
        argv += ["--manager", manager]
    status = main(argv)
    captured = capsys.readouterr()
    print(captured.out)  # shown with -s or on failure
    assert status == 0, captured.err[-3000:]

    data = json.loads((out / "airflow-bench.json").read_text())
    names = [t["name"] for t in data["targets"]]
    assert names == ["sqlite"]
    assert (out / "airflow-bench.md").read_text() in captured.out
    assert "Legend" in captured.out
    for name in names:
        assert (out / f"airflow-bench-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Every manager ran in processes that resolved its class from the config option.
    classes = {w["manager"]: w["class"] for w in data["workers"]}
    assert classes == CLASSES
    assert len(data["workers"]) == len(CLASSES) * PRODUCERS

    for name in names:
        sweep = [r for r in data["summary"]["sweep"] if r["db"] == name]
        assert {(r["fanout"], r["manager"]) for r in sweep} == {(f, m) for f in (1, 64) for m in CLASSES}
        plugin_calls = [r for r in data["sweep"] if r["db"] == name and r["manager"] == "plugin"]
        assert plugin_calls and all(r["rows_exact"] for r in plugin_calls)

        rounds = [r for r in data["rounds"] if r["db"] == name and r["manager"] == "plugin"]
        assert {r["scenario"] for r in rounds} == {"single", "multi_outlet"}
        for rnd in rounds:
            assert rnd["rows_exact"], rnd["check"]
            assert rnd["committed"] == PRODUCERS * TRANSACTIONS
            assert (
                rnd["events"]
                == rnd["expected_events"]
                == rnd["committed"] * (1 if rnd["scenario"] == "single" else data["sizes"]["outlets"])
            )
        plugin = [r for r in data["summary"]["contention"] if r["db"] == name and r["manager"] == "plugin"]
        assert [r["deadlocks"] for r in plugin] == [0, 0]
        assert all(r["rows_exact"] for r in plugin)


def test_refuses_a_database_with_airflow_tables(tmp_path):
    metadata = tmp_path / "airflow.db"
    engine = sa.create_engine(f"sqlite:///{metadata}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE dag (dag_id VARCHAR(250) PRIMARY KEY)")
    engine.dispose()
    with pytest.raises(run.BenchError, match=r"has Airflow tables \(dag\)"):
        run.refuse_airflow_database(f"sqlite:///{metadata}")
    assert main(["--db", f"sqlite:///{metadata}", "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()

    run.refuse_airflow_database(f"sqlite:///{tmp_path / 'absent.db'}")
    run.refuse_airflow_database("sqlite://")


def test_airflow_drivers():
    assert run.airflow_url("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert run.airflow_url("mysql://u@h/db") == "mysql+mysqldb://u@h/db"
    assert run.airflow_url("mariadb://u@h/db") == "mysql+mysqldb://u@h/db"
    assert run.airflow_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
