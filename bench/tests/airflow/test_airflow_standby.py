"""``airflow-adrq bench --airflow --standby``, tiny: the replica really streamed and both managers ran.

One run of 4-second phases (stock, then the plug-in) on a throwaway primary and its
``pg_basebackup -R`` standby: it must exit 0; the primary must list the standby in
``pg_stat_replication`` as streaming, the standby must be in recovery and hold the primary's
``asset_event`` and queue rows, and its readers must have read queue rows; the report must have
a phase per manager, the plug-in's with one SAVEPOINT per transaction and stock's with none;
every line printed must fit in 100 columns; the two servers' directories must be gone.
Timings are printed, never asserted. Needs the PostgreSQL server binaries (pg_basebackup).
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from airflow_adrq_bench.airflow_mode import main
from airflow_adrq_bench.airflow_mode.standby import cluster
from airflow_adrq_testing import servers

LINE = tuple(int(part) for part in version("apache-airflow-core").split(".")[:2])
pytestmark = pytest.mark.skipif(
    LINE not in ((3, 3), (3, 4)), reason=f"bench --airflow runs on Airflow 3.3 and 3.4, not {LINE}"
)


@pytest.fixture
def binaries() -> None:
    try:
        bindir = servers._postgresql_bindir()
    except servers.ServerNotFoundError as exc:
        pytest.skip(str(exc))
    if not (bindir / "pg_basebackup").is_file():
        pytest.skip(f"no pg_basebackup in {bindir}")


@pytest.mark.slow
def test_tiny_run_streams_to_the_standby_and_reports_both_managers(binaries, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--airflow", "--standby", "--quick", "--phase-s", "4", "--background-xids", "100"]
    argv += ["--manager", "stock", "--manager", "plugin", "--out", str(out)]
    status = main(argv)
    captured = capsys.readouterr()
    print(captured.out)  # shown with -s or on failure
    assert status == 0, captured.err[-3000:]
    assert max(map(len, captured.out.splitlines())) <= 100, captured.out

    data = json.loads((out / "standby.json").read_text())
    (target,) = data["targets"]
    streaming = [r for r in target["replication"] if r["state"] == "streaming"]
    assert streaming, f"pg_stat_replication on the primary: {target['replication']}"
    assert target["standby_in_recovery"]
    assert target["counts"]["standby"] == target["counts"]["primary"]
    assert target["counts"]["primary"]["asset_event"] > 0
    assert target["open_transaction_age"]["xids_since"] > 0

    phases = {p["manager"]: p for p in data["phases"]}
    assert list(phases) == ["stock", "plugin"]
    for manager, phase in phases.items():
        txs = phase["transactions"]
        assert txs["committed"] == txs["planned"] > 0, (manager, txs)
        assert phase["reader"]["passes"] > 0, manager
        assert phase["reader"]["samples"] > 0, manager
        assert "Subtrans" in phase["slru"]["standby"], phase["slru"]
    # Every plug-in transaction opened its SAVEPOINT (a retry may open more); stock opens none. 3.4's
    # per-event queue needs no dag share lock, so the plug-in opens none there either.
    plugin = phases["plugin"]["transactions"]
    if LINE == (3, 4):
        assert plugin["savepoints"] == 0, plugin
    else:
        assert plugin["savepoints"] >= plugin["committed"], plugin
    assert phases["stock"]["transactions"]["savepoints"] == 0
    # The standby's readers read queue rows the producers wrote on the primary.
    assert any(p["reader"]["queue_rows_seen"] for p in data["phases"])

    assert {r["manager"] for r in data["summary"]} == {"stock", "plugin"}
    assert any(v["what"] == "standby reader p99 vs stock" for v in data["verdict"])
    assert "Legend" in (out / "standby.md").read_text()
    # The two servers' scratch directories (the primary's, the standby's) are gone with them.
    assert len(data["directories"]) == 2
    assert not [d for d in data["directories"] if Path(d).exists()], data["directories"]


def test_the_servers_are_removed_when_the_run_fails(binaries):
    directories: tuple[str, ...] = ()
    with pytest.raises(RuntimeError, match="inside"), cluster.primary_and_standby() as pair:
        directories = pair.directories
        assert all(Path(d).is_dir() for d in directories) and len(directories) == 2
        raise RuntimeError("inside")
    assert not [d for d in directories if Path(d).exists()]


def test_help_fits_in_100_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        main(["--airflow", "--standby", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "--overflow-control" in text and "--background-xids" in text
    assert max(map(len, text.splitlines())) <= 100
