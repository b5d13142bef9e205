"""``airflow-adrq bench --airflow --live --small``: a real Airflow 3.3.2 deployment per manager.

Per backend one run at the CI size (2 producer DAGs x 4 mapped instances x 2 outlets, 8 consumer
DAGs, 2 bursts), stock then plug-in, each on its own scratch database; about 2-3 minutes per
backend on 2 cores. PostgreSQL's deployments have the shape bigger installations run
(:data:`SHAPES`): two schedulers (HA mode), CeleryExecutor with two workers on Redis, every
component through a throwaway PgBouncer in transaction pooling mode; MariaDB's one scheduler with
LocalExecutor, directly. Asserted for the plug-in, through the verdict the run prints and the raw
results: no failed producer task, no deadlock, no event lost or consumed twice, exactly the expected
events, an empty queue, and stranded pairs only where allowed (on MariaDB, whose scheduler takes no
row locks, pairs that wait for the next event are by design: 0-17 % at this size); for both
managers: the deployment completed, and the report carries every row. And
``--expect-stock-worse``: the same harness must show stock failing producer tasks or stranding
events, so it can tell the two apart. At this size stock did in every run but one, so a clean
stock deployment is run again, alone, up to :data:`STOCK_ATTEMPTS` deployments in all.
"""

from __future__ import annotations

import json

import pytest

from airflow_adrq_bench.airflow_mode import main as airflow_mode_main
from airflow_adrq_bench.airflow_mode.config import LIVE_SMALL as SMALL
from airflow_adrq_bench.airflow_mode.config import LiveSizes
from airflow_adrq_bench.airflow_mode.live import churn, report

#: Each backend's deployment shape (HA schedulers and PgBouncer are PostgreSQL's; so is the pause churn
#: here, whose lock sampler is PostgreSQL's).
SHAPES = {
    "postgresql": (
        *("--schedulers", "2", "--pgbouncer", "--executor", "celery", "--celery-workers", "2"),
        "--pause-churn",
    ),
    "mysql": (),
}
#: What the report names each shape by (its ``shape`` in live.json).
SHAPE_INFO = {
    "postgresql": {
        "executor": "CeleryExecutor",
        "celery_workers": 2,
        "pgbouncer": True,
        "schedulers": 2,
        "pause_churn": True,
    },
    "mysql": {"executor": "LocalExecutor", "celery_workers": 0, "pgbouncer": False, "schedulers": 1},
}
#: Stock deployments the negative control may take (see the module docstring).
STOCK_ATTEMPTS = 3
# The start of report.problems()'s line for a stock that looked clean.
_STOCK_BLIND = "--expect-stock-worse"


def _live_run(server_url, out, *extra, control=True):
    """One ``--live --small`` run (``--expect-stock-worse`` with ``control``): its exit status and raw
    results (None: the run did not start; the reason is on stderr). ``server_url`` names an empty
    database (``fresh_db_url``): the server's default one may hold Airflow tables, which the run refuses."""
    argv = ["--airflow", "--live", "--small", "--db", server_url, "--out", str(out), "--time-limit", "600"]
    status = airflow_mode_main([*argv, *(["--expect-stock-worse"] if control else []), *extra])
    path = out / "live.json"
    return status, json.loads(path.read_text()) if path.exists() else None


def _assert_plugin_clean(plugin, sizes, raw):
    assert plugin["error"] is None, f"{plugin['error']} (api-server log: {plugin['api_server_log']})"
    assert plugin["tasks"]["tasks"] == sizes.tasks_per_burst * sizes.bursts
    assert plugin["tasks"]["failed"] == 0
    deadlocks = plugin["deadlocks"]
    assert deadlocks["log_lines_components"] == 0 and deadlocks["log_lines_tasks"] == 0, deadlocks
    if deadlocks["server_scope"] == "database":
        assert deadlocks["server"] == 0, deadlocks
    assert sum(plugin["events"]["written"].values()) == sizes.expected_events
    # The consumers the pause churn toggles are left out of the pairs.
    toggled = churn.toggled(sizes.consumer_ids) if plugin["shape"]["pause_churn"] else []
    assert plugin["after_bursts"]["pairs"] == sizes.expected_events * (sizes.consumers - len(toggled))
    assert plugin["after_extra"]["stranded"] == 0, "pairs lost even to the next event"
    assert plugin["after_bursts"]["consumed_twice"] == 0 and plugin["after_extra"]["consumed_twice"] == 0
    assert plugin["after_bursts"]["queue_rows"] == 0 and plugin["after_extra"]["queue_rows"] == 0
    assert plugin["after_bursts"]["stranded"] <= report.stranded_allowed(plugin), plugin["after_bursts"]
    assert plugin["patch_state"]["calls"] >= sizes.tasks_per_burst * sizes.bursts
    assert not [code for code in plugin["patch_state"]["status"] if code.startswith("5")], plugin[
        "patch_state"
    ]
    if plugin["churn"] is not None:
        assert plugin["churn"]["calls"] > 0 and plugin["churn"]["5xx"] == 0, plugin["churn"]
    if plugin["backend"] == "postgresql":
        assert plugin["lock_waits"]["samples"] > 0 and plugin["lock_waits"]["error"] is None
    # The verdict says the same: every target of correctness met (speed and #66853's memory and p99
    # against stock: met, MISSED or n/a); on PostgreSQL also the producers' waits against their
    # holders, with the churn its 5xx answers.
    against_stock = (report.SPEED.what, report.P99.what, report.MEMORY.what, report.P99_BURST.what)
    correctness = [v for v in raw["verdict"] if v["what"] not in against_stock]
    expected = 7 + (plugin["backend"] == "postgresql") + (plugin["churn"] is not None)
    assert len(correctness) == expected and {v["verdict"] for v in correctness} == {"met"}, raw["verdict"]


@pytest.mark.slow
@pytest.mark.backends("postgresql", "mysql")
def test_small_live_run_plugin_is_clean(backend, fresh_db_url, broker, tmp_path, capsys):
    shape = (*SHAPES[backend], *broker)
    status, raw = _live_run(fresh_db_url, tmp_path / "live", *shape)
    captured = capsys.readouterr()
    print(captured.out)  # the verdict, shown with -s or on failure
    assert raw is not None, f"the live run did not start (exit {status}): {captured.err[-3000:]}"
    assert "## Verdict" in captured.out and "Legend" not in captured.out  # the detail is in live.md
    first_blind = any(p.startswith(_STOCK_BLIND) for p in raw["problems"])
    others = [p for p in raw["problems"] if not p.startswith(_STOCK_BLIND)]
    blind, attempts = first_blind, 1
    while blind and attempts < STOCK_ATTEMPTS:
        attempts += 1
        again, again_raw = _live_run(
            fresh_db_url, tmp_path / f"stock-{attempts}", *shape, "--manager", "stock"
        )
        blind = again != 0
        print(f"stock deployment {attempts} of {STOCK_ATTEMPTS}: problems {again_raw['problems']}")
    assert not blind, f"stock looked clean in {attempts} deployment(s): the harness cannot tell them apart"
    cells = {c["manager"]: c for c in raw["cells"]}
    assert set(cells) == {"stock", "plugin"}
    for manager, cell in cells.items():
        assert cell["error"] is None, f"{manager}: {cell['error']} (api-server log: {cell['api_server_log']})"
        assert cell["shape"].items() >= SHAPE_INFO[backend].items(), cell["shape"]
        for key in ("tasks", "deadlocks", "events", "after_bursts", "after_extra", "bursts", "patch_state"):
            assert key in cell
    _assert_plugin_clean(cells["plugin"], SMALL, raw)
    text = " ".join((tmp_path / "live" / "live.md").read_text().split())  # whatever the columns' widths
    assert f"; {report.shape_label(cells['plugin']['shape'])} " in text
    assert all(f"| {label} |" in text for label, _ in report.ROWS) and "Legend" in text
    assert others == []
    # 1 only for the negative control, met by a later stock deployment (above).
    assert status == 0 or (first_blind and not others), captured.err[-3000:]


@pytest.mark.slow
@pytest.mark.backends("postgresql")
def test_small_live_run_producers_of_different_assets_plugin_is_clean(fresh_db_url, broker, tmp_path, capsys):
    """The shape that found the race the ``dag`` share lock closes: each producer DAG emits assets of
    its own into the same consumers (half on the OR of every asset, half on the AND), two
    schedulers, CeleryExecutor, PgBouncer. The plug-in only: the control that loses events in this
    shape is the forced interleaving of tests/concurrency/test_dag_share_lock.py."""
    extra = (*SHAPES["postgresql"], *broker, "--own-assets", "--manager", "plugin")
    status, raw = _live_run(fresh_db_url, tmp_path / "live", *extra, control=False)
    captured = capsys.readouterr()
    print(captured.out)
    assert raw is not None, f"the live run did not start (exit {status}): {captured.err[-3000:]}"
    (plugin,) = raw["cells"]
    assert raw["sizes"]["own_assets"] is True
    # Pairs of a0 & a1 & ... consumers whose condition the last burst left incomplete wait for the
    # next event of each asset; none may be stranded otherwise.
    _assert_plugin_clean(plugin, LiveSizes(**{**SMALL.__dict__, "own_assets": True}), raw)
    assert plugin["after_bursts"]["stranded"] == 0, plugin["after_bursts"]
    assert raw["problems"] == [] and status == 0, (raw["problems"], captured.err[-3000:])
