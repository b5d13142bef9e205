"""``airflow-adrq bench --airflow --live``: a real Airflow 3.3.2 deployment per manager, small.

The live run needs the full ``apache-airflow`` 3.3.2 distribution (the
``airflow`` command with its api-server, the task SDK and the standard
provider's ``EmptyOperator``), not only ``apache-airflow-core``: the tox
environments of tests/plugin install the core alone, so there the live tests
skip themselves with the reason shown. Run them from an environment with the
full distribution::

    pip install "apache-airflow==3.3.2" asyncpg aiomysql matplotlib psycopg2-binary mysqlclient \
        apache-airflow-providers-celery 'celery[redis]<5.7'
    pip install -e . --no-deps
    pytest -p no:cacheprovider tests/plugin/test_live.py -s

Per backend (PostgreSQL, MariaDB/MySQL): one run at the CI size (``--small``:
2 producer DAGs x 4 mapped instances x 2 outlets, 8 consumer DAGs, 2 bursts),
stock then plug-in, each on its own scratch database; about 2-3 minutes per
backend on 2 cores. PostgreSQL's deployments have the shape bigger
installations run (:data:`SHAPES`): two schedulers (HA mode), CeleryExecutor
with two workers on the local Redis (127.0.0.1:6379; when none answers, a
throwaway ``redis-server`` the test starts, :func:`broker`), and every
component through a throwaway PgBouncer in transaction pooling mode (the
``pgbouncer`` binary); MariaDB's one scheduler with LocalExecutor, directly.
Asserted for the plug-in: no failed producer task, no deadlock (server counter
of the scratch database on PostgreSQL; log lines on both), no stranded and no
double-consumed (event, consumer) pair, exactly the expected asset events, an
empty queue (on MariaDB, whose scheduler takes no row locks and where the
plug-in's default refreshes existing rows after COMMIT, pairs that wait for
the next event are a note: 0-17 % at this size, measured at the default size
in BENCHMARKS.md; none may be left after one more event); for both
managers: the deployment completed, and the report and JSON carry every
row. And ``--expect-stock-worse``: the same harness must show stock failing
producer tasks or stranding events, so it can tell the two
apart. At this size stock stranded 6-43 % of the pairs in every run but one,
which showed neither failed tasks nor stranded pairs, so a clean stock
deployment is run again, alone, up to :data:`STOCK_ATTEMPTS` deployments in
all. Plus checks of the pieces that need no deployment: the access-log parser,
the pair counting rules, the exit-status rules, the DAG files (compiled).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from airflow_adrq_bench.airflow_mode import main as airflow_mode_main
from airflow_adrq_bench.airflow_mode.live import config, dags, measure, report, scaleout
from airflow_adrq_testing import servers
from tests.support.ci import in_ci

LIVE_LINE = "3.3.2"

#: Each backend's deployment shape (HA schedulers and PgBouncer are PostgreSQL's).
SHAPES = {
    "postgresql": ("--schedulers", "2", "--pgbouncer", "--executor", "celery", "--celery-workers", "2"),
    "mysql": (),
}
#: What the report names each shape by (its ``shape`` in live.json).
SHAPE_INFO = {
    "postgresql": {"executor": "CeleryExecutor", "celery_workers": 2, "pgbouncer": True, "schedulers": 2},
    "mysql": {"executor": "LocalExecutor", "celery_workers": 0, "pgbouncer": False, "schedulers": 1},
}


def _live_unavailable() -> str | None:
    """Why the live run cannot run in this environment (None: it can)."""
    try:
        core = importlib.metadata.version("apache-airflow-core")
    except importlib.metadata.PackageNotFoundError:
        return "apache-airflow-core is not installed"
    if core != LIVE_LINE:
        return f"the live run is written for Airflow {LIVE_LINE}; this is {core}"
    needed = {
        "apache-airflow": "the full apache-airflow distribution",
        "apache-airflow-task-sdk": "the task SDK (airflow.sdk)",
        "apache-airflow-providers-standard": "the standard provider (EmptyOperator)",
    }
    for dist, what in needed.items():
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"needs {what} ({dist}); tox's airflow envs install apache-airflow-core only"
    if not (Path(sys.executable).parent / "airflow").exists():
        return "no airflow command next to this interpreter"
    if importlib.util.find_spec("matplotlib") is None:
        return "needs matplotlib"
    return None


_UNAVAILABLE = _live_unavailable()
if _UNAVAILABLE is not None and os.environ.get("ADRQ_REQUIRE_LIVE"):
    # tox -e airflow-live sets it: there a skip would be a silent green.
    raise RuntimeError(f"ADRQ_REQUIRE_LIVE is set but the live run cannot run here: {_UNAVAILABLE}")
live_only = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"live Airflow run: {_UNAVAILABLE}")


# --- the live run -------------------------------------------------------------------


def _live_run(server, out, *extra, control=True):
    """One ``--live --small`` run (``--expect-stock-worse`` with ``control``); its exit status and raw
    results (None: the run did not start, e.g. no Redis: the reason is on stderr)."""
    status = airflow_mode_main(
        [
            "--airflow",
            "--live",
            "--small",
            "--db",
            server.render_as_string(hide_password=False),
            "--out",
            str(out),
            "--time-limit",
            "600",
            # The check can fail: the same harness must show stock failing tasks or stranding events.
            *(["--expect-stock-worse"] if control else []),
            *extra,
        ]
    )
    path = out / "live.json"
    return status, json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def broker(af_backend):
    """``--broker-url`` for the PostgreSQL shape: none while the local Redis answers (the run's
    default), else a throwaway ``redis-server``'s; nothing for the other backends."""
    if af_backend != "postgresql":
        yield ()
        return
    try:
        scaleout.check_broker(f"{scaleout.DEFAULT_REDIS}/0")
    except config.LiveError:
        pass
    else:
        yield ()
        return
    try:
        with servers.redis() as url:
            yield ("--broker-url", f"{url}/1")
    except servers.ServerNotFoundError as exc:
        message = f"no Redis for the CeleryExecutor deployment: none on 127.0.0.1:6379, and {exc}"
        if in_ci() or os.environ.get("ADRQ_REQUIRE_LIVE"):
            pytest.fail(message)
        pytest.skip(message)


#: Stock deployments the negative control may take (see the module docstring).
STOCK_ATTEMPTS = 3
# The start of report.problems()'s line for a stock that looked clean.
_STOCK_BLIND = "--expect-stock-worse"


@live_only
@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql", "mysql")
def test_small_live_run_plugin_is_clean(af_backend, af_server, broker, tmp_path, capsys):
    out = tmp_path / "live"
    shape = (*SHAPES[af_backend], *broker)
    status, raw = _live_run(af_server, out, *shape)
    captured = capsys.readouterr()
    print(captured.out)  # the table, shown with -s or on failure
    assert raw is not None, f"the live run did not start (exit {status}): {captured.err[-3000:]}"
    first_blind = any(p.startswith(_STOCK_BLIND) for p in raw["problems"])
    others = [p for p in raw["problems"] if not p.startswith(_STOCK_BLIND)]
    blind, attempts = first_blind, 1
    while blind and attempts < STOCK_ATTEMPTS:
        attempts += 1
        again, again_raw = _live_run(af_server, tmp_path / f"stock-{attempts}", *shape, "--manager", "stock")
        blind = again != 0
        print(f"stock deployment {attempts} of {STOCK_ATTEMPTS}: problems {again_raw['problems']}")
    assert not blind, f"stock looked clean in {attempts} deployment(s): the harness cannot tell them apart"
    cells = {c["manager"]: c for c in raw["cells"]}
    assert set(cells) == {"stock", "plugin"}
    for manager, cell in cells.items():
        assert cell["error"] is None, f"{manager}: {cell['error']} (api-server log: {cell['api_server_log']})"
        assert cell["shape"].items() >= SHAPE_INFO[af_backend].items(), cell["shape"]

    sizes = config.SMALL
    plugin = cells["plugin"]
    assert plugin["tasks"]["tasks"] == sizes.tasks_per_burst * sizes.bursts
    assert plugin["tasks"]["failed"] == 0
    deadlocks = plugin["deadlocks"]
    assert deadlocks["log_lines_components"] == 0 and deadlocks["log_lines_tasks"] == 0, deadlocks
    if deadlocks["server_scope"] == "database":
        assert deadlocks["server"] == 0
    assert sum(plugin["events"]["written"].values()) == sizes.expected_events
    pairs = sizes.expected_events * sizes.consumers
    assert plugin["after_bursts"]["pairs"] == pairs
    assert plugin["after_extra"]["stranded"] == 0, "pairs lost even to the next event"
    assert plugin["after_extra"]["consumed_twice"] == 0
    assert plugin["after_bursts"]["queue_rows"] == 0 and plugin["after_extra"]["queue_rows"] == 0
    assert plugin["patch_state"]["calls"] >= sizes.tasks_per_burst * sizes.bursts
    server_errors = [code for code in plugin["patch_state"]["status"] if code.startswith("5")]
    assert not server_errors, plugin["patch_state"]

    text = (out / "live.md").read_text()
    assert f"; {report.shape_label(cells['plugin']['shape'])}\n" in text
    for label, _ in report.ROWS:
        assert f"| {label} |" in " ".join(text.split())  # whatever the column's width
    assert "Legend" in text
    assert (out / "live.png").stat().st_size > 0
    for key in ("tasks", "deadlocks", "events", "after_bursts", "after_extra", "bursts", "patch_state"):
        assert key in cells["stock"] and key in plugin
    stranded = plugin["after_bursts"]["stranded"]
    # 0 on PostgreSQL; on MariaDB, whose scheduler takes no row locks and where the
    # plug-in refreshes after COMMIT, a note (GUARANTEES.md, "Timing"; BENCHMARKS.md measures
    # the share at the default size), never a pair lost to the next event (above).
    assert stranded <= report.stranded_allowed(plugin), plugin["after_bursts"]
    assert raw["notes"] == report.notes(raw["cells"])
    assert others == []
    # 1 only for the negative control, met by a later stock deployment (above).
    assert status == 0 or (first_blind and not others), captured.err[-3000:]


@live_only
@pytest.mark.slow
@pytest.mark.airflow_backends("postgresql")
def test_small_live_run_producers_of_different_assets_plugin_is_clean(af_server, broker, tmp_path, capsys):
    """The shape that found the race the ``dag`` share lock closes: each producer DAG emits assets of
    its own into the same consumers (half on the OR of every asset, half on the AND), two
    schedulers, CeleryExecutor, PgBouncer. The plug-in only: the control that loses events in this
    shape is the forced interleaving of tests/concurrency/test_dag_share_lock.py."""
    out = tmp_path / "live"
    status, raw = _live_run(
        af_server, out, *SHAPES["postgresql"], *broker, "--own-assets", "--manager", "plugin", control=False
    )
    captured = capsys.readouterr()
    print(captured.out)
    assert raw is not None, f"the live run did not start (exit {status}): {captured.err[-3000:]}"
    (plugin,) = raw["cells"]
    assert plugin["error"] is None, f"{plugin['error']} (api-server log: {plugin['api_server_log']})"
    sizes = config.LiveSizes(**{**config.SMALL.__dict__, "own_assets": True})
    assert raw["sizes"]["own_assets"] is True
    assert plugin["tasks"]["tasks"] == sizes.tasks_per_burst * sizes.bursts
    assert plugin["tasks"]["failed"] == 0
    deadlocks = plugin["deadlocks"]
    assert deadlocks["log_lines_components"] == 0 and deadlocks["log_lines_tasks"] == 0, deadlocks
    assert deadlocks["server"] == 0, deadlocks
    assert sum(plugin["events"]["written"].values()) == sizes.expected_events
    # Every event is of one producer's asset; every consumer is scheduled on every asset.
    assert plugin["after_bursts"]["pairs"] == sizes.expected_events * sizes.consumers
    # Pairs of a0 & a1 & ... consumers whose condition the last burst left incomplete wait for
    # the next event of each asset; none may be stranded otherwise.
    assert plugin["after_bursts"]["stranded"] == 0, plugin["after_bursts"]
    assert plugin["after_bursts"]["consumed_twice"] == 0, plugin["after_bursts"]
    assert plugin["after_extra"]["stranded"] == 0 and plugin["after_extra"]["consumed_twice"] == 0
    assert plugin["after_bursts"]["queue_rows"] == 0 and plugin["after_extra"]["queue_rows"] == 0
    assert raw["problems"] == [] and status == 0, (raw["problems"], captured.err[-3000:])


# --- the pieces (no deployment) -----------------------------------------------------------

_ACCESS = (
    "2026-12-01T07:55:34.464448Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36226 duration_us=1228245 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099-dfb2-7477-a471-3b04240cd413/state query= status_code=204\n"
    "2026-12-01T07:55:30.764984Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36216 duration_us=9652333 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099-dfb1-792b-88a6-ff8f05633131/run query= status_code=200\n"
    "2026-12-01T07:55:35.000000Z [info     ] request finished               [http.access] "
    "client_addr=127.0.0.1:36227 duration_us=2000 loc=http_access_log.py:130 method=PATCH "
    "path=/execution/task-instances/01a23099dfb37006bbdc96d8d8765c29/state query= status_code=409\n"
)


def test_access_log_gives_the_state_calls_with_their_durations(tmp_path):
    log = tmp_path / "api-server.log"
    log.write_text(_ACCESS)
    records = measure.parse_access_log(log)
    assert [(r.ti_id, r.status, r.duration_ms) for r in records] == [
        ("01a23099dfb27477a4713b04240cd413", 204, 1228.245),
        ("01a23099dfb37006bbdc96d8d8765c29", 409, 2.0),
    ]
    assert records[0].at.isoformat() == "2026-12-01T07:55:34.464448+00:00"
    summary = measure.latency_summary(records, ["01a23099dfb27477a4713b04240cd413"])
    assert (summary["calls"], summary["p50_ms"], summary["status"]) == (1, 1228.245, {"204": 1})


def test_deadlock_lines_match_both_servers_messages(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "psycopg2.errors.DeadlockDetected: deadlock detected\n"
        "MySQLdb.OperationalError: (1213, 'Deadlock found when trying to get lock')\n"
        "duration_us=1213 status_code=204\n"
        "all fine\n"
    )
    assert measure.deadlock_lines([log]) == {str(log): 2}


def _cell(manager, **changes):
    cell = {
        "db": "postgresql",
        "manager": manager,
        "run": 1,
        "error": None,
        "tasks": {"tasks": 8, "failed": 0, "retried": 0},
        "deadlocks": {
            "server": 0,
            "server_scope": "database",
            "latest_names_database": None,
            "log_lines_components": 0,
            "log_lines_tasks": 0,
        },
        "events": {"written": {"burst00": 16, "burst01": 16}, "expected": 32},
        "after_bursts": {"pairs": 256, "stranded": 0, "last_burst_stranded": 0, "queue_rows": 0},
        "after_extra": {"pairs": 256, "stranded": 0, "consumed_twice": 0, "queue_rows": 0},
        "patch_state": {"calls": 8, "status": {"204": 8}},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            cell[section] = {**cell[section], field: value}
        else:
            cell[section] = value
    return cell


def test_exit_status_rules():
    clean = [_cell("stock"), _cell("plugin")]
    assert report.problems(clean) == []
    assert report.problems(clean, expect_stock_worse=True)  # stock was not worse: fails
    stock_worse = [_cell("stock", tasks__failed=3), _cell("plugin")]
    assert report.problems(stock_worse, expect_stock_worse=True) == []
    # Stock's own failures never fail the run; the plug-in's always do.
    assert report.problems([_cell("stock", after_bursts__stranded=9), _cell("plugin")]) == []
    for change in (
        {"tasks__failed": 1},
        {"deadlocks__server": 1},
        {"deadlocks__log_lines_tasks": 2},
        {"after_bursts__stranded": 1},
        {"after_extra__consumed_twice": 1},
        {"after_extra__queue_rows": 1},
        {"events__written": {"burst00": 16, "burst01": 15}},
        {"patch_state__status": {"204": 8, "500": 1}},
        {"error": "time limit"},
    ):
        assert report.problems([_cell("stock"), _cell("plugin", **change)]), change
    # MariaDB's counter is server-wide: it fails the plug-in only when the latest deadlock is ours.
    mariadb = {"server": 2, "server_scope": "server", "latest_names_database": False}
    other = _cell("plugin", deadlocks={**_cell("plugin")["deadlocks"], **mariadb})
    assert report.problems([other]) == []
    ours = _cell("plugin", deadlocks={**other["deadlocks"], "latest_names_database": True})
    assert report.problems([ours])


def test_dag_files_compile_and_name_the_configured_dags(tmp_path):
    sizes = config.LiveSizes(instances=3, outlets=2, consumers=5, producer_dags=2)
    paths = dags.write_dag_files(tmp_path / "dags", tmp_path / "barrier", sizes)
    assert [p.name for p in paths] == [dags.PRODUCERS_FILE, dags.CONSUMERS_FILE, dags.WARMUP_FILE]
    for path in paths:
        compile(path.read_text(), str(path), "exec")
    producers = paths[0].read_text()
    for dag_id in config.producer_dag_ids(sizes):
        assert dag_id in producers
    assert '"expected": 6' in producers  # every instance of every producer DAG meets at the barrier
    consumers = paths[1].read_text()
    assert config.consumer_dag_ids(sizes)[-1] in consumers and '"a1"' in consumers


def test_own_assets_give_each_producer_its_outlets_and_half_the_consumers_the_and(tmp_path):
    sizes = config.LiveSizes(instances=3, outlets=2, consumers=4, producer_dags=2, own_assets=True)
    assert config.asset_names(sizes) == ["p0a0", "p0a1", "p1a0", "p1a1"]
    assert config.all_of_consumers(sizes) == config.consumer_dag_ids(sizes)[2:]
    paths = dags.write_dag_files(tmp_path / "dags", tmp_path / "barrier", sizes)
    for path in paths:
        compile(path.read_text(), str(path), "exec")
    producers = json.loads(
        paths[0].read_text().split("SETTINGS = json.loads(", 1)[1].split(")\n", 1)[0][1:-1]
    )
    assert producers["outlets"] == {
        "adrq_live_producer_0": ["p0a0", "p0a1"],
        "adrq_live_producer_1": ["p1a0", "p1a1"],
    }
    consumers = paths[1].read_text()
    assert (
        "operator.and_" in consumers
        and '"all_of": ["adrq_live_consumer_002", "adrq_live_consumer_003"]' in consumers
    )


def test_default_time_limit_grows_with_the_burst():
    small, big = config.default_time_limit(config.SMALL), config.default_time_limit(config.DEFAULT)
    assert 300 < small < big
    assert config.default_time_limit(config.LiveSizes(producer_dags=4)) > big


def test_stranded_pairs_allowed_follow_the_plugins_policy_and_backend():
    def cell(version, policy, events=768):
        start_up = f"airflow-adrq: ... sorted by (asset_id, dag_id), on_conflict={policy}"
        written = {"burst00": events}
        return {
            "version": version,
            "plugin_start_up": start_up,
            "after_bursts": {"pairs": 49152},
            "events": {"written": written},
        }

    assert report.plugin_policy(cell("MariaDB 10.11", "refresh_after_commit")) == "refresh_after_commit"
    assert report.plugin_policy({"plugin_start_up": None}) == "auto"
    assert report.stranded_allowed(cell("PostgreSQL 15.20", "auto")) == 0
    assert report.stranded_allowed(cell("MariaDB 10.11", "auto")) == 49152  # a note
    assert report.stranded_allowed(cell("MariaDB 10.11", "refresh_after_commit")) == 49152
    assert report.stranded_allowed(cell("MariaDB 10.11", "refresh")) == 0
    assert report.stranded_allowed(cell("PostgreSQL 15.20", "ignore")) == 49152
