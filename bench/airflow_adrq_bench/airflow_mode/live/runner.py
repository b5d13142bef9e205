"""One cell of the live run: one manager's deployment on one backend, measured end to end.

:func:`run_cell` creates the scratch database (``adrq_live_<manager>_<random>``
on the target's server), writes the DAG files, migrates, starts the
deployment, lets the :class:`~.driver.Driver` run it, counts, stops every
component and drops the database (``keep_scratch`` keeps it, and the scratch
``AIRFLOW_HOME``). A cell that fails (a component exits, the hard time limit
passes, an HTTP call fails) is recorded with its error and log paths, so the
next cell still runs; Ctrl-C stops and cleans up, then propagates.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq_bench.airflow_mode.databases import Target, airflow_url, control_engine
from airflow_adrq_bench.airflow_mode.live import measure
from airflow_adrq_bench.airflow_mode.live.config import MANAGER_CLASSES, Deadline, LiveShape, LiveSizes
from airflow_adrq_bench.airflow_mode.live.dags import write_dag_files
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment
from airflow_adrq_bench.airflow_mode.live.driver import Driver, Progress, seconds_between
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_testing import servers

__all__ = ["run_cell"]


def run_cell(
    target: Target,
    manager: str,
    run_index: int,
    sizes: LiveSizes,
    *,
    out: Path,
    time_limit_s: float,
    keep_scratch: bool = False,
    manager_kwargs: str | None = None,
    shape: LiveShape | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run and measure one deployment; returns its raw results (``error`` set when it failed)."""
    label = f"{target.name} {manager} run {run_index + 1}"
    database = f"adrq_live_{manager}_{secrets.token_hex(3)}"
    log_dir = out / "logs" / f"{target.name}-{manager}-run{run_index + 1}"
    home = Path(tempfile.mkdtemp(prefix=f"adrq-live-{target.name}-{manager}-"))
    result: dict[str, Any] = {
        "db": target.name,
        "backend": target.backend,
        "version": target.version,
        "manager": manager,
        "manager_class": MANAGER_CLASSES[manager],
        "manager_kwargs": manager_kwargs,
        "run": run_index + 1,
        "database": database,
        "home": str(home),
        "log_dir": str(log_dir),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "time_limit_s": time_limit_s,
        "error": None,
    }
    deadline = Deadline(time_limit_s)
    progress = Progress(label)
    try:
        url = airflow_url(servers.create_database(target.server_url, database))
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    engine = control_engine(url)
    deployment = Deployment(
        name=label,
        backend=target.backend,
        url=url,
        manager_class=MANAGER_CLASSES[manager],
        sizes=sizes,
        home=home,
        log_dir=log_dir,
        manager_kwargs=manager_kwargs,
        shape=shape,
        server_url=target.server_url,
    )
    result["schedulers"] = deployment.schedulers
    result["shape"] = deployment.shape_info
    result["api_server_log"] = str(deployment.log_of("api-server"))
    failed = True
    try:
        write_dag_files(deployment.dags_folder, deployment.barrier_dir, sizes)
        progress.update("airflow db migrate", force=True)
        deployment.migrate(timeout=deadline.left())
        with engine.connect() as conn:
            before = measure.deadlock_counter(conn, database)
        with deployment:
            deployment.start()
            driver = Driver(deployment, engine, deadline, progress)
            driver.run(result)
            stopping = time.monotonic()
            result["killed"] = deployment.stop()
            driver.timeline["stop_s"] = time.monotonic() - stopping
        with engine.connect() as conn:
            after = measure.deadlock_counter(conn, database)
        result["deadlocks"] = _deadlocks(before, after, deployment, home)
        _latency(result, deployment)
        result["plugin_start_up"] = _plugin_line(deployment)
        result["timeline"] = {k: round(v, 1) for k, v in driver.timeline.items()}
        failed = False
    except (BenchError, SQLAlchemyError, OSError) as exc:
        result["error"] = str(exc)
        say(
            f"{label}: FAILED: {exc}\n  api-server log: {deployment.log_of('api-server')}\n"
            f"  AIRFLOW_HOME kept (DAG files, task logs): {home}"
        )
    finally:
        result["killed"] = result.get("killed") or deployment.stop()
        result["duration_s"] = round(deadline.elapsed(), 1)
        progress.done(f"{'failed' if failed else 'done'} in {deadline.elapsed():.0f} s")
        engine.dispose()
        if not keep_scratch:
            with contextlib.suppress(SQLAlchemyError):
                servers.drop_database(target.server_url, database)
        # A failed deployment keeps its AIRFLOW_HOME (task logs) for a look; an interrupted one does not.
        if keep_scratch or result["error"] is not None:
            result["kept"] = {"home": str(home), "database": database if keep_scratch else None}
        else:
            shutil.rmtree(home, ignore_errors=True)
    return result


def _deadlocks(
    before: dict[str, Any], after: dict[str, Any], deployment: Deployment, home: Path
) -> dict[str, Any]:
    component_logs = sorted(deployment.log_dir.glob("*.log"))
    task_logs = sorted((home / "logs").rglob("*.log")) if (home / "logs").exists() else []
    in_components = measure.deadlock_lines(component_logs)
    in_tasks = measure.deadlock_lines(task_logs)
    return {
        "server": after["value"] - before["value"],
        "server_scope": after["scope"],
        "latest_names_database": after["latest_names_database"],
        "log_lines_components": sum(in_components.values()),
        "log_lines_tasks": sum(in_tasks.values()),
        "log_files": {**in_components, **in_tasks},
    }


def _plugin_line(deployment: Deployment) -> str | None:
    """The plug-in's start-up line in the api-server's log (names its on_conflict policy), if any."""
    try:
        with deployment.log_of("api-server").open(errors="replace") as handle:
            for line in handle:
                if "airflow-adrq: " in line and "on_conflict=" in line:
                    return line.split("airflow-adrq: ", 1)[1].split(" [", 1)[0].strip()
    except OSError:
        return None
    return None


def _latency(result: dict[str, Any], deployment: Deployment) -> None:
    """The task-success calls from the access log; each burst's done = its last such call answered."""
    records = measure.parse_access_log(deployment.log_of("api-server"))
    run_of = dict(zip(result.get("producer_ti_ids", []), result.get("producer_ti_runs", []), strict=True))
    for info in result.get("bursts", []):
        ends = [r.at for r in records if r.at is not None and run_of.get(r.ti_id) == info["run_id"]]
        info["last_state_call_at"] = max(ends).isoformat() if ends else None
        # Done: the last success call answered (a task's end_date is the SDK's, before that call).
        info["trigger_to_done_s"] = seconds_between(info["triggered_at"], info["last_state_call_at"])
    result["patch_state"] = {
        "source": "api-server access log (HttpAccessLogMiddleware: request finished ... duration_us)",
        **measure.latency_summary(records, result.get("producer_ti_ids", [])),
    }
    result["patch_state_all_calls"] = len(records)
