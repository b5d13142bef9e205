"""One cell of the live run: one manager's deployment on one database server, driven and measured
through its public interfaces, as an operator's tooling would: the REST API for what Airflow does,
read-only SQL (:mod:`.measure`) for what it waits for and counts. A cell that fails records its error
and the next cell still runs."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, WARM_DAG, LiveError, LiveSizes
from airflow_adrq_bench.airflow_mode.databases import control_engine, fetch, queue_rows
from airflow_adrq_bench.airflow_mode.live import measure
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.progress import Task

# Seconds between polls of the database while waiting.
_POLL_S = 0.5


def steps(sizes: LiveSizes) -> int:
    """The progress steps of one deployment: migrate, ready, parsed, warm, each burst, two drains, stop."""
    return 7 + sizes.bursts


def run_cell(deployment: Deployment, run: int, bar: Task, time_limit_s: float) -> dict[str, Any]:
    """Run and measure ``deployment`` (run number ``run``), counting its :func:`steps` on ``bar``; returns
    its raw results (``error`` set when it failed)."""
    target, name = deployment.target, deployment.log_dir.name
    result: dict[str, Any] = {
        "db": target.name,
        "backend": target.backend,
        "version": target.version,
        "manager": deployment.manager,
        "manager_class": MANAGER_CLASSES[deployment.manager],
        "manager_kwargs": deployment.manager_kwargs,
        "run": run,
        "database": deployment.database,
        "log_dir": str(deployment.log_dir),
        "api_server_log": str(deployment.log_of("api-server")),
        "shape": deployment.shape_info,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "error": None,
    }
    started = time.monotonic()
    driver = _Driver(deployment, bar, time_limit_s)
    try:
        with driver.http, deployment:
            driver.run(result)
    except (BenchError, SQLAlchemyError, OSError) as exc:
        result["error"] = str(exc)
        bar.say(f"{name}: FAILED: {exc}\n  AIRFLOW_HOME kept (DAG files, task logs): {deployment.home}")
    finally:
        result["duration_s"] = round(time.monotonic() - started, 1)
        result["kept"] = deployment.kept
        # What this cell did not get to counts as done: the bar's total stays true.
        bar.step(f"{name}: {'failed' if result['error'] else 'done'}", steps(deployment.sizes) - driver.done)
    return result


class _Driver:
    """Drives one deployment from ``airflow db migrate`` to its stop (each wait one step of ``bar``, all
    within ``time_limit_s``) and collects what happened when."""

    def __init__(self, deployment: Deployment, bar: Task, time_limit_s: float) -> None:
        self.deployment, self.bar, self.time_limit_s = deployment, bar, time_limit_s
        self.deadline = time.monotonic() + time_limit_s
        self.http = httpx.Client(base_url=deployment.base_url, timeout=60.0, trust_env=False)
        self.sizes = sizes = deployment.sizes
        self.producers, self.consumers, self.run_ids = sizes.producer_ids, sizes.consumer_ids, sizes.run_ids
        self.started, self.done = time.monotonic(), 0
        self.timeline: dict[str, float] = {}

    def call(self, method: str, path: str, body: object = None, *, timeout: float = 60.0) -> Any:
        """One REST call; its JSON answer. Raises :class:`LiveError` when it fails."""
        try:
            response = self.http.request(method, path, json=body, timeout=timeout)
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise LiveError(
                f"{method} {path}: HTTP {exc.response.status_code}: {exc.response.text[:500]}"
            ) from None
        except httpx.HTTPError as exc:
            raise LiveError(f"{method} {path}: {exc}") from None
        return response.json() if response.content else None

    def trigger(self, dag_id: str, run_id: str) -> None:
        """A manual run of ``dag_id``, no logical date; ``conf["burst"]`` names the producers' barrier."""
        body = {"dag_run_id": run_id, "logical_date": None, "conf": {"burst": run_id}}
        self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def _wait(self, doing: str, done: Callable[[], tuple[bool, str]]) -> None:
        """Poll ``done`` (whether, and a status) until it is; each poll checks the components and the
        time limit, and shows the status."""
        while True:
            self.deployment.check_alive()
            finished, status = done()
            left = self.deadline - time.monotonic()
            self.bar.step(f"{doing}: {status} ({left:.0f} s to the limit)", advance=int(finished))
            if finished:
                self.done += 1
                self.timeline[doing] = round(time.monotonic() - self.started, 1)
                return
            if left <= 0:
                raise LiveError(f"the time limit passed while {doing}")
            time.sleep(_POLL_S)

    def wait_ready(self) -> None:
        """Until the api-server answers and reports a healthy scheduler and DAG processor; then log in."""

        def ready() -> tuple[bool, str]:
            try:
                health = self.call("GET", "/api/v2/monitor/health", timeout=10)
            except LiveError:
                return False, "api-server not answering yet"
            waiting = [
                k for k, v in health.items() if k != "triggerer" and (v or {}).get("status") != "healthy"
            ]
            return not waiting, f"waiting for {', '.join(waiting)}" if waiting else "healthy"

        self._wait("starting", ready)
        self.http.headers["Authorization"] = f"Bearer {self.call('GET', '/auth/token')['access_token']}"

    def wait_parsed(self) -> None:
        """Until the DAG processor has written every DAG, unpaused, with its asset references."""
        dag_ids = [*self.producers, *self.consumers, WARM_DAG]
        references = self.sizes.consumers * len(self.sizes.assets)
        dag_sql = (
            "SELECT count(*) FROM dag d WHERE d.dag_id IN :ids AND NOT d.is_paused "
            "AND EXISTS (SELECT 1 FROM serialized_dag s WHERE s.dag_id = d.dag_id)"
        )
        ref_sql = "SELECT count(*) FROM dag_schedule_asset_reference WHERE dag_id IN :ids"

        def parsed() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                dags = int(fetch(conn, dag_sql, ids=dag_ids)[0][0])
                refs = int(fetch(conn, ref_sql, ids=self.consumers)[0][0])
            status = f"{dags}/{len(dag_ids)} DAGs, {refs}/{references} schedule references"
            return dags == len(dag_ids) and refs == references, status

        self._wait("parsing the DAG files", parsed)

    def _wait_runs(self, doing: str, dag_ids: Sequence[str], run_id: str) -> None:
        where = {"dag_ids": list(dag_ids), "run_ids": [run_id]}

        def finished() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                runs = measure.counts(conn, measure.RUN_STATES, **where)
                tasks = measure.counts(conn, measure.TASK_STATES, **where)
                queue, consumer_runs = queue_rows(conn), measure.run_count(conn, self.consumers)
            done = sum(n for s, n in runs.items() if s in measure.TERMINAL_RUN_STATES)
            status = (
                f"runs {done}/{len(dag_ids)} done; tasks {tasks.get('success', 0)}/{sum(tasks.values())} "
                f"succeeded, {tasks.get('failed', 0)} failed, {tasks.get('up_for_retry', 0)} up for retry; "
                f"queue {queue} rows; consumer runs {consumer_runs}"
            )
            return done == len(dag_ids), status

        self._wait(doing, finished)

    def drain(self, doing: str) -> dict[str, Any]:
        """Until no queue row is left (but those of all-of consumers waiting for another asset) and no
        new consumer run appeared for ``settle_s``; after ``drain_timeout_s``, what it saw (the queue
        left is then part of the results, not an error)."""
        started = time.monotonic()
        seen = {"runs": -1, "since": started, "queue": -1}

        def drained() -> tuple[bool, str]:
            with self.engine.connect() as conn:
                queue = queue_rows(conn) - len(self._waiting_rows(conn))
                runs = measure.run_count(conn, self.consumers)
            now = time.monotonic()
            if runs != seen["runs"] or queue:
                seen["since"] = now
            seen["runs"], seen["queue"] = runs, queue
            quiet = now - seen["since"]
            status = f"queue {queue} rows, consumer runs {runs}, quiet {quiet:.0f}/{self.sizes.settle_s:g} s"
            done = queue == 0 and quiet >= self.sizes.settle_s
            return done or now - started > self.sizes.drain_timeout_s, status

        self._wait(doing, drained)
        elapsed, queue = round(time.monotonic() - started, 2), seen["queue"]
        return {"seconds": elapsed, "drained": queue == 0, "queue_rows": queue, "consumer_runs": seen["runs"]}

    def run(self, result: dict[str, Any]) -> None:
        """Migrate, start, drive the deployment and count after each drain, stop it and count what the
        server and the logs say (the results go into ``result``)."""
        deployment, name = self.deployment, self.deployment.log_dir.name
        self.engine = control_engine(deployment.url)  # no pool: nothing to dispose of
        self.bar.step(f"{name}: airflow db migrate")
        deployment.migrate(timeout=self.time_limit_s)
        self.bar.step(f"{name}: starting the components", advance=1)
        self.done += 1
        with self.engine.connect() as conn:
            before = measure.deadlock_counter(conn, deployment.database)
        deployment.start()
        self.started = time.monotonic()
        self.wait_ready()
        self.wait_parsed()
        self.trigger(WARM_DAG, "warmup")  # every execution-API call once: the bursts meet a warm api-server
        self._wait_runs("warming up", [WARM_DAG], "warmup")
        triggered = []
        for burst, run_id in enumerate(self.run_ids):
            triggered.append(dt.datetime.now(dt.timezone.utc).isoformat())
            for dag_id in self.producers:
                self.trigger(dag_id, run_id)
            self._wait_runs(f"burst {burst + 1}/{self.sizes.bursts}", self.producers, run_id)
        result["drain_after_bursts"] = self.drain("draining after the bursts")
        params = {"dag_ids": self.producers, "run_ids": self.run_ids}
        with self.engine.connect() as conn:
            result["tasks"], bursts, run_of = measure.producer_tasks(conn, self.producers, self.run_ids)
            written = measure.counts(conn, measure.EVENTS, **params)
            result["after_bursts"] = self._after(conn)
        result["events"] = {
            "written": {run_id: written.get(run_id, 0) for run_id in self.run_ids},
            "expected": self.sizes.expected_events,
        }
        result["bursts"] = [{"triggered_at": t, **b} for t, b in zip(triggered, bursts, strict=True)]
        # One more event of every outlet asset: a pair stranded by the bursts that it picks up was late.
        names = self.sizes.assets
        with self.engine.connect() as conn:
            ids = dict(fetch(conn, "SELECT name, id FROM asset WHERE name IN :names", names=names))
        if len(ids) < len(names):
            raise LiveError(f"assets {', '.join(sorted(set(names) - set(ids)))} are not in the database")
        body = {"extra": {"adrq_live": "one more event"}}
        result["extra_event_ids"] = [
            self.call("POST", "/api/v2/assets/events", {**body, "asset_id": ids[n]})["id"] for n in names
        ]
        result["drain_after_extra"] = self.drain("draining after one more event")
        with self.engine.connect() as conn:
            result["after_extra"] = self._after(conn)
        result["killed"] = deployment.stop()
        with self.engine.connect() as conn:
            after = measure.deadlock_counter(conn, deployment.database)
        logs, task_logs = deployment.log_dir.glob("*.log"), (deployment.home / "logs").rglob("*.log")
        result["deadlocks"] = measure.deadlocks(before, after, logs, task_logs)
        result |= measure.state_calls(deployment.log_of("api-server"), result["bursts"], run_of)
        result["plugin_start_up"] = measure.plugin_line(deployment.log_of("api-server"))
        result["timeline"] = self.timeline

    def _waiting_rows(self, conn: sa.Connection) -> frozenset[tuple[int, str]]:
        """Queue rows of ``a0 & a1 & ...`` consumers still missing an asset: waiting, by design (a burst
        can complete the condition before its last instances commit: their rows wait for the next)."""
        all_of = self.sizes.all_of_ids
        if not all_of:
            return frozenset()
        sql = "SELECT asset_id, target_dag_id FROM asset_dag_run_queue WHERE target_dag_id IN :d"
        per_dag: dict[str, list[int]] = {}
        for asset_id, dag_id in fetch(conn, sql, d=all_of):
            per_dag.setdefault(str(dag_id), []).append(int(asset_id))
        need = len(self.sizes.assets)
        return frozenset((a, d) for d, assets in per_dag.items() if len(assets) < need for a in assets)

    def _after(self, conn: sa.Connection) -> dict[str, Any]:
        """The pairs, the consumer runs and the queue rows (but those waiting) after a drain."""
        waiting = self._waiting_rows(conn)
        out = measure.count_pairs(conn, self.producers, self.consumers, self.run_ids, waiting)
        out["consumer_runs"] = measure.run_count(conn, self.consumers)
        return {**out, "queue_rows": queue_rows(conn) - len(waiting), "queue_rows_waiting": len(waiting)}
