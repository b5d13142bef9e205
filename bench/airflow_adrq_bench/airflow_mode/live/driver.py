"""One cell of the live run: one manager's deployment on one backend, driven and measured end to end.

:func:`run_cell` creates the scratch database (``adrq_live_<manager>_<random>``),
writes the DAG files, migrates, starts the deployment, lets the :class:`Driver`
run it (wait until it is ready, warm it up, trigger the bursts, drain, count),
stops every component and drops the database (``keep_scratch`` keeps it, and
the scratch ``AIRFLOW_HOME``). A cell that fails (a component exits, the hard
time limit passes, an HTTP call fails) is recorded with its error and log
paths, so the next cell still runs; Ctrl-C stops and cleans up, then propagates.

The driver goes through the deployment's public interfaces, as an operator's
tooling would: the REST API (``GET /auth/token``, which ``[core]
simple_auth_manager_all_admins`` opens; ``POST /api/v2/dags/{id}/dagRuns``;
``POST /api/v2/assets/events``) for what Airflow does, and read-only SQL on
the scratch database (:mod:`.measure`) for what the driver waits for and
counts. Every wait checks the deployment's hard time limit and that no
component has exited, and updates a progress line on stderr.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq_bench.airflow_mode.databases import Target, airflow_url, control_engine, fetch, queue_rows
from airflow_adrq_bench.airflow_mode.live import measure
from airflow_adrq_bench.airflow_mode.live.config import (
    MANAGER_CLASSES,
    WARM_DAG,
    Deadline,
    LiveError,
    LiveShape,
    LiveSizes,
    all_of_consumers,
    asset_names,
    burst_run_id,
    consumer_dag_ids,
    producer_dag_ids,
)
from airflow_adrq_bench.airflow_mode.live.dags import write_dag_files
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_testing import servers

__all__ = ["Api", "Driver", "Progress", "run_cell", "seconds_between"]

# Seconds between polls of the database while waiting.
_POLL_S = 0.5


class Api:
    """A minimal JSON client of one api-server (urllib: nothing beyond the standard library)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token: str | None = None

    def call(self, method: str, path: str, body: object = None, *, timeout: float = 60.0) -> Any:
        """Send one request; returns the decoded JSON answer. Raises :class:`LiveError` on HTTP errors."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise LiveError(
                f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise LiveError(f"{method} {path}: {exc}") from None
        return json.loads(raw) if raw else None

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
        """``POST /api/v2/dags/{dag_id}/dagRuns`` (a manual run, no logical date)."""
        self.call(
            "POST",
            f"/api/v2/dags/{dag_id}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None, "conf": conf},
        )


class Progress:
    """One progress line on stderr: rewritten in place on a terminal, else printed every 15 s."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.last_print = 0.0
        self.width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` (on a non-terminal at most every 15 s unless ``force``)."""
        line = f"{self.label}: {text}"
        if self.tty:
            pad = max(0, self.width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self.width = len(line)
        else:
            now = time.monotonic()
            if not force and now - self.last_print < 15:
                return
            self.last_print = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """End the line with ``text``."""
        self.update(text, force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0


@dataclass
class Driver:
    """Runs the bursts on one started deployment and collects what happened when."""

    deployment: Deployment
    engine: sa.Engine
    deadline: Deadline
    progress: Progress
    api: Api = field(init=False)
    sizes: LiveSizes = field(init=False)
    timeline: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.api = Api(self.deployment.base_url)
        self.sizes = self.deployment.sizes
        self.producers = producer_dag_ids(self.sizes)
        self.consumers = consumer_dag_ids(self.sizes)
        self.run_ids = [burst_run_id(b) for b in range(self.sizes.bursts)]

    # --- waiting ------------------------------------------------------------------------

    def _wait(self, doing: str, done: Callable[[], tuple[bool, str]]) -> None:
        """Poll ``done`` until it says so; each poll checks the time limit and the components."""
        while True:
            self.deployment.check_alive()
            finished, status = done()
            left = self.deadline.left()
            self.progress.update(f"{doing}: {status} [{self.deadline.elapsed():.0f} s, {left:.0f} s left]")
            if finished:
                return
            self.deadline.check(doing)
            time.sleep(_POLL_S)

    def wait_ready(self) -> None:
        """Until the api-server answers and reports a healthy scheduler and DAG processor."""

        def ready() -> tuple[bool, str]:
            try:
                health = self.api.call("GET", "/api/v2/monitor/health", timeout=10)
            except LiveError:
                return False, "api-server not answering yet"
            states = {k: (v or {}).get("status") for k, v in health.items() if k != "triggerer"}
            waiting = [k for k, v in states.items() if v != "healthy"]
            return not waiting, f"waiting for {', '.join(waiting)}" if waiting else "healthy"

        self._wait("starting", ready)
        # GET /auth/token is open with [core] simple_auth_manager_all_admins.
        self.api.token = str(self.api.call("GET", "/auth/token")["access_token"])
        self.timeline["ready_s"] = self.deadline.elapsed()

    def wait_parsed(self) -> None:
        """Until the DAG processor has written every DAG, unpaused, with its asset references."""
        dag_ids = [*self.producers, *self.consumers, WARM_DAG]
        references = self.sizes.consumers * len(asset_names(self.sizes))
        dag_sql = sa.text(
            "SELECT count(*) FROM dag d WHERE d.dag_id IN :dag_ids AND d.is_paused = :paused "
            "AND EXISTS (SELECT 1 FROM serialized_dag s WHERE s.dag_id = d.dag_id)"
        ).bindparams(sa.bindparam("dag_ids", expanding=True))
        ref_sql = sa.text(
            "SELECT count(*) FROM dag_schedule_asset_reference WHERE dag_id IN :dag_ids"
        ).bindparams(sa.bindparam("dag_ids", expanding=True))

        def parsed() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                dags = int(conn.execute(dag_sql, {"dag_ids": dag_ids, "paused": False}).scalar_one())
                refs = int(conn.execute(ref_sql, {"dag_ids": self.consumers}).scalar_one())
            return (
                dags == len(dag_ids) and refs == references,
                f"{dags}/{len(dag_ids)} DAGs, {refs}/{references} schedule references",
            )

        self._wait("parsing the DAG files", parsed)
        self.timeline["parsed_s"] = self.deadline.elapsed()

    def _wait_runs(self, doing: str, dag_ids: Sequence[str], run_ids: Sequence[str]) -> None:
        expected = len(dag_ids) * len(run_ids)

        def finished() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                runs = measure.counts(conn, measure.RUN_STATES, dag_ids=list(dag_ids), run_ids=list(run_ids))
                tasks = measure.counts(
                    conn, measure.TASK_STATES, dag_ids=list(dag_ids), run_ids=list(run_ids)
                )
                queue = queue_rows(conn)
                consumer_runs = measure.run_count(conn, self.consumers)
            done = sum(n for s, n in runs.items() if s in measure.TERMINAL_RUN_STATES)
            total = sum(tasks.values())
            status = (
                f"runs {done}/{expected} done; tasks {tasks.get('success', 0)}/{total} succeeded, "
                f"{tasks.get('failed', 0)} failed, {tasks.get('up_for_retry', 0)} up for retry; "
                f"queue {queue} rows; consumer runs {consumer_runs}"
            )
            return done == expected, status

        self._wait(doing, finished)

    # --- the run ------------------------------------------------------------------------

    def warm_up(self) -> dict[str, Any]:
        """One run of the warm-up DAG: every execution-API call once, so the bursts meet a warm api-server."""
        started = time.time()
        self.api.trigger(WARM_DAG, "warmup", {})
        self._wait_runs("warming up", [WARM_DAG], ["warmup"])
        with self.engine.connect() as conn:
            states = measure.counts(conn, measure.TASK_STATES, dag_ids=[WARM_DAG], run_ids=["warmup"])
        self.timeline["warm_s"] = self.deadline.elapsed()
        return {"seconds": round(time.time() - started, 2), "tasks": states}

    def bursts(self) -> list[dict[str, Any]]:
        """Trigger every producer DAG, wait until all their runs are done; ``bursts`` times."""
        out = []
        for burst, run_id in enumerate(self.run_ids):
            triggered_at = dt.datetime.now(dt.timezone.utc)
            for dag_id in self.producers:
                self.api.trigger(dag_id, run_id, {"burst": run_id})
            self._wait_runs(f"burst {burst + 1}/{self.sizes.bursts}", self.producers, [run_id])
            out.append({"run_id": run_id, "triggered_at": triggered_at.isoformat()})
        self.timeline["bursts_s"] = self.deadline.elapsed()
        return out

    def drain(self, doing: str) -> dict[str, Any]:
        """Until no queue row is left and no new consumer run appeared for ``settle_s``.

        Gives up after ``drain_timeout_s`` and returns what it saw (the queue
        left behind is then part of the results, not an error).
        """
        started = time.monotonic()
        give_up = started + self.sizes.drain_timeout_s
        state = {"runs": -1, "since": started, "queue": -1}

        def drained() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                queue = queue_rows(conn) - len(self._waiting_rows(conn))
                runs = measure.run_count(conn, self.consumers)
            now = time.monotonic()
            if runs != state["runs"] or queue:
                state["since"] = now
            state["runs"], state["queue"] = runs, queue
            quiet = now - state["since"]
            timed_out = now > give_up
            return (
                (queue == 0 and quiet >= self.sizes.settle_s) or timed_out,
                f"queue {queue} rows, consumer runs {runs}, quiet {quiet:.0f}/{self.sizes.settle_s:g} s",
            )

        self._wait(doing, drained)
        return {
            "seconds": round(time.monotonic() - started, 2),
            "drained": state["queue"] == 0,
            "queue_rows": state["queue"],
            "consumer_runs": state["runs"],
        }

    def extra_events(self) -> list[int]:
        """One more event of every outlet asset, through ``POST /api/v2/assets/events``; returns their ids."""
        names = asset_names(self.sizes)
        with self.engine.connect() as conn:
            ids = {
                str(n): int(i) for n, i in fetch(conn, "SELECT name, id FROM asset WHERE name IN :n", n=names)
            }
        missing = [name for name in names if name not in ids]
        if missing:
            raise LiveError(f"assets {', '.join(missing)} are not in the database")
        extra = {"adrq_live": "one more event"}
        return [
            int(self.api.call("POST", "/api/v2/assets/events", {"asset_id": ids[n], "extra": extra})["id"])
            for n in names
        ]

    def run(self, result: dict[str, Any]) -> None:
        """Drive the deployment and count after each drain (the results go into ``result``)."""
        sizes, producers, run_ids = self.sizes, self.producers, self.run_ids
        self.wait_ready()
        self.wait_parsed()
        result["warm_up"] = self.warm_up()
        bursts = self.bursts()
        result["drain_after_bursts"] = self.drain("draining after the bursts")
        with self.engine.connect() as conn:
            tasks = measure.producer_tasks(conn, producers, run_ids)
            summary = measure.task_summary(tasks, run_ids)
            written = measure.counts(conn, measure.EVENTS, dag_ids=producers, run_ids=run_ids)
            result["events"] = {
                "written": {run_id: written.get(run_id, 0) for run_id in run_ids},
                "expected_per_run": sizes.instances * sizes.outlets * sizes.producer_dags,
                "expected": sizes.expected_events,
            }
            result["after_bursts"] = self._after(conn)
        for burst, info in zip(summary["bursts"], bursts, strict=True):
            info.update(burst)
            info["trigger_to_end_date_s"] = seconds_between(info["triggered_at"], burst["last_end"])
        result["tasks"] = {k: v for k, v in summary.items() if k != "bursts"}
        result["bursts"] = bursts
        result["producer_ti_ids"] = [t.id for t in tasks]
        result["producer_ti_runs"] = [t.run_id for t in tasks]
        time.sleep(0.1)
        result["extra_event_ids"] = self.extra_events()
        result["drain_after_extra"] = self.drain("draining after one more event")
        with self.engine.connect() as conn:
            result["after_extra"] = self._after(conn, states=True)

    def _waiting_rows(self, conn: sa.Connection) -> frozenset[tuple[int, str]]:
        """Queue rows of ``a0 & a1 & ...`` consumers still missing an asset: waiting, by design.

        A burst can complete an all-of consumer's condition before its last
        instances commit; their rows then wait for the next burst's events.
        """
        all_of = all_of_consumers(self.sizes)
        if not all_of:
            return frozenset()
        rows = fetch(
            conn,
            "SELECT asset_id, target_dag_id FROM asset_dag_run_queue WHERE target_dag_id IN :d",
            d=all_of,
        )
        need = len(asset_names(self.sizes))
        per_dag: dict[str, list[int]] = {}
        for asset_id, dag_id in rows:
            per_dag.setdefault(str(dag_id), []).append(int(asset_id))
        return frozenset((a, d) for d, assets in per_dag.items() if len(assets) < need for a in assets)

    def _after(self, conn: sa.Connection, *, states: bool = False) -> dict[str, Any]:
        """The pairs, the consumer runs (their states) and the queue rows after a drain."""
        waiting = self._waiting_rows(conn)
        pairs = measure.count_pairs(conn, self.producers, self.consumers, self.run_ids, waiting)
        out: dict[str, Any] = {**pairs.as_dict(), "consumer_runs": measure.run_count(conn, self.consumers)}
        if states:
            out["consumer_run_states"] = measure.counts(
                conn, measure.CONSUMER_RUN_STATES, dag_ids=self.consumers
            )
        # Rows left, but those waiting for an all-of consumer's other assets.
        return {**out, "queue_rows": queue_rows(conn) - len(waiting), "queue_rows_waiting": len(waiting)}


def seconds_between(start: str, end: str | None) -> float | None:
    """Seconds from ISO timestamp ``start`` to ``end`` (None without an end)."""
    if end is None:
        return None
    return round((dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds(), 2)


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
