"""One cell of the live run: one manager's deployment on one database server, driven and measured through its
public interfaces, as an operator's tooling would: the REST API for what Airflow does, read-only SQL for what
it waits for and counts (plain SQL on the scratch database: the controller never imports Airflow), plus the
server's deadlock counter and the components' logs. What each count means is the live legend's
(``legends.md``). A cell that fails records its error and the next cell still runs."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import httpx
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, WARM_DAG, LiveError, LiveSizes
from airflow_adrq_bench.airflow_mode.databases import control_engine, fetch, latest_deadlock, queue_rows
from airflow_adrq_bench.airflow_mode.live import churn, lock_waits, memory
from airflow_adrq_bench.airflow_mode.live.churn import Churn
from airflow_adrq_bench.airflow_mode.live.churn import summarize as summarize_churn
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.progress import Task
from airflow_adrq_bench.stats import percentile


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
        except httpx.HTTPError as exc:
            raise LiveError(f"{method} {path}: {exc}") from None
        if not response.is_success:
            raise LiveError(f"{method} {path}: HTTP {response.status_code}: {response.text[:500]}")
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
            time.sleep(0.5)  # between polls of the database

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
                runs = counts(conn, RUN_STATES, **where)
                tasks = counts(conn, TASK_STATES, **where)
                queue, consumer_runs = queue_rows(conn), run_count(conn, self.consumers)
            done = sum(n for s, n in runs.items() if s in ("success", "failed"))
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
                runs = run_count(conn, self.consumers)
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
            before = deadlock_counter(conn, deployment.database)
        deployment.start()
        self.started = time.monotonic()
        self.wait_ready()
        self.wait_parsed()
        self.trigger(WARM_DAG, "warmup")  # every execution-API call once: the bursts meet a warm api-server
        self._wait_runs("warming up", [WARM_DAG], "warmup")
        triggered = self._bursts(result)
        result["drain_after_bursts"] = self.drain("draining after the bursts")
        names = self.sizes.assets
        with self.engine.connect() as conn:
            result["tasks"], bursts, run_of = producer_tasks(conn, self.producers, self.run_ids)
            written = counts(conn, EVENTS, dag_ids=self.producers, run_ids=self.run_ids)
            result["after_bursts"] = self._after(conn)
            ids = dict(fetch(conn, "SELECT name, id FROM asset WHERE name IN :names", names=names))
        result["events"] = {
            "written": {run_id: written.get(run_id, 0) for run_id in self.run_ids},
            "expected": self.sizes.expected_events,
        }
        result["bursts"] = [{"triggered_at": t, **b} for t, b in zip(triggered, bursts, strict=True)]
        # One more event of every outlet asset: a pair stranded by the bursts that it picks up was late.
        if len(ids) < len(names):
            raise LiveError(f"assets {', '.join(sorted(set(names) - set(ids)))} are not in the database")
        body = {"extra": {"adrq_live": "one more event"}}
        posted = [self.call("POST", "/api/v2/assets/events", {**body, "asset_id": ids[n]}) for n in names]
        result["extra_event_ids"] = [event["id"] for event in posted]
        result["drain_after_extra"] = self.drain("draining after one more event")
        with self.engine.connect() as conn:
            result["after_extra"] = self._after(conn)
        result["killed"] = deployment.stop()
        with self.engine.connect() as conn:
            after = deadlock_counter(conn, deployment.database)
        # The server counter's difference, and the deadlock lines in the components' and the tasks' logs.
        in_components = deadlock_lines(sorted(deployment.log_dir.glob("*.log")))
        in_tasks = deadlock_lines(sorted((deployment.home / "logs").rglob("*.log")))
        result["deadlocks"] = {
            **after,
            "server": after["server"] - before["server"],
            "log_lines_components": sum(in_components.values()),
            "log_lines_tasks": sum(in_tasks.values()),
            "log_files": {**in_components, **in_tasks},
        }
        result |= state_calls(deployment.log_of("api-server"), result["bursts"], run_of)
        result["in_flight"] = in_flight(deployment.log_of("api-server"), result["bursts"])
        result["plugin_start_up"] = plugin_line(deployment.log_of("api-server"))
        result["timeline"] = self.timeline

    def _bursts(self, result: dict[str, Any]) -> list[str]:
        """Trigger every burst and wait for its producer runs (the api-server's memory sampler running
        meanwhile; with ``--pause-churn`` and on PostgreSQL also the churn and the lock sampler: their
        summaries go into ``result``; the memory's also when a burst fails: a stock api-server that
        stopped answering mid-burst is #66853's case); returns when each burst was triggered."""
        triggered, churning, sampler = [], None, None
        rss = memory.Sampler(self.deployment.components["api-server"].pid, self.deployment.database_port)
        try:
            with contextlib.ExitStack() as during:
                during.enter_context(rss)
                if self.deployment.shape.pause_churn:
                    churning = Churn(self.deployment.base_url, self.http.headers, self.consumers)
                    during.enter_context(churning)
                if self.deployment.target.backend == "postgresql":
                    sampler = during.enter_context(lock_waits.Sampler(self.engine))
                for burst, run_id in enumerate(self.run_ids):
                    rss.mark(run_id)
                    triggered.append(dt.datetime.now(dt.timezone.utc).isoformat())
                    for dag_id in self.producers:
                        self.trigger(dag_id, run_id)
                    self._wait_runs(f"burst {burst + 1}/{self.sizes.bursts}", self.producers, run_id)
        finally:
            result["api_server_memory"] = rss.summary()  # after leaving: with each process's VmHWM
        calls = None if churning is None else {"toggled": churning.toggled, **summarize_churn(churning.calls)}
        result["churn"] = calls
        result["lock_waits"] = None if sampler is None else sampler.summary()
        return triggered

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
        """After a drain: the (event, consumer) pairs of the burst runs' events, how many no run consumed
        (``stranded``; also of the last burst alone), how many two or more runs of the DAG did, how many
        are ``waiting`` (unconsumed, of the queue rows of all-of consumers missing an asset); the consumer
        runs and the queue rows (but those waiting)."""
        waiting = self._waiting_rows(conn)
        keys = ("pairs", "stranded", "consumed_twice", "last_burst_pairs", "last_burst_stranded", "waiting")
        out = dict.fromkeys(keys, 0)
        # The consumers the pause churn toggles are not accounted: their events are not queued while paused.
        toggled = churn.toggled(self.consumers) if self.deployment.shape.pause_churn else []
        consumers = [c for c in self.consumers if c not in toggled]
        params = {"producers": self.producers, "consumers": consumers, "run_ids": self.run_ids}
        for asset_id, run_id, dag_id, runs in fetch(conn, _PAIRS, **params):
            out["pairs"] += 1
            if runs == 0 and (int(asset_id), str(dag_id)) in waiting:
                out["waiting"] += 1
                continue
            out["stranded"] += runs == 0
            out["consumed_twice"] += runs > 1
            if run_id == self.run_ids[-1]:
                out["last_burst_pairs"] += 1
                out["last_burst_stranded"] += runs == 0
        out["consumer_runs"] = run_count(conn, self.consumers)
        return {**out, "queue_rows": queue_rows(conn) - len(waiting), "queue_rows_waiting": len(waiting)}


#: A line that reports a deadlock: PostgreSQL's message and SQLSTATE, MySQL/MariaDB's message and errno.
DEADLOCK_LINE: Final = re.compile(r"deadlock detected|Deadlock found|40P01|\(1213,", re.IGNORECASE)

# ``SELECT key, count(*) ... GROUP BY key`` of the runs, task instances and events :func:`counts` reads.
_WHERE = "WHERE dag_id IN :dag_ids AND run_id IN :run_ids"
RUN_STATES: Final = f"SELECT state, count(*) FROM dag_run {_WHERE} GROUP BY state"
TASK_STATES: Final = f"SELECT state, count(*) FROM task_instance {_WHERE} GROUP BY state"
EVENTS: Final = (
    "SELECT source_run_id, count(*) FROM asset_event "
    "WHERE source_dag_id IN :dag_ids AND source_run_id IN :run_ids GROUP BY source_run_id"
)

# Per (event of a burst run, consumer DAG scheduled on its asset): the runs of that DAG that consumed it.
_PAIRS = """
SELECT e.asset_id, e.source_run_id, r.dag_id, count(d.id) FROM asset_event e
JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id AND r.dag_id IN :consumers
LEFT JOIN (dagrun_asset_event x JOIN dag_run d ON d.id = x.dag_run_id)
  ON x.event_id = e.id AND d.dag_id = r.dag_id
WHERE e.source_dag_id IN :producers AND e.source_run_id IN :run_ids
GROUP BY e.id, e.asset_id, e.source_run_id, r.dag_id
"""


def counts(conn: sa.Connection, sql: str, **params: Any) -> dict[str, int]:
    """``{key: count}`` of a ``SELECT key, count(*)`` (a NULL key is ``"none"``)."""
    return {str(key or "none"): int(n) for key, n in fetch(conn, sql, **params)}


def run_count(conn: sa.Connection, dag_ids: Sequence[str]) -> int:
    """Runs of these DAGs."""
    return int(fetch(conn, "SELECT count(*) FROM dag_run WHERE dag_id IN :ids", ids=list(dag_ids))[0][0])


def producer_tasks(
    conn: sa.Connection, dag_ids: Sequence[str], run_ids: Sequence[str]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """The producer task instances of the burst runs: failed / retried / succeeded overall; the same per
    burst, with its tasks' last ``end_date`` and their spread; and each one's burst by its id."""
    sql = f"SELECT id, run_id, state, try_number, end_date FROM task_instance {_WHERE}"
    rows = fetch(conn, sql, dag_ids=list(dag_ids), run_ids=list(run_ids))

    def tally(mine: Sequence[tuple[Any, ...]]) -> dict[str, int]:
        retried = sum((tries or 0) > 1 for *_, tries, _ in mine)
        return {"tasks": len(mine), "failed": sum(r[2] == "failed" for r in mine), "retried": retried}

    bursts = []
    for run_id in run_ids:
        mine = [r for r in rows if r[1] == run_id]
        ends = sorted(_utc(end) for *_, end in mine if end is not None)
        # end_spread_s: how close together the success calls finished (they set end_date).
        spread = (ends[-1] - ends[0]).total_seconds() if ends else None
        last = ends[-1].isoformat() if ends else None
        bursts.append({"run_id": run_id, **tally(mine), "last_end": last, "end_spread_s": spread})
    states = Counter(str(state or "none") for _, _, state, _, _ in rows)
    other = {k: n for k, n in states.items() if k not in ("success", "failed")}
    overall = {**tally(rows), "succeeded": states["success"], "other": other}
    return overall, bursts, {_uuid_hex(ti_id): str(run_id) for ti_id, run_id, *_ in rows}


def deadlock_counter(conn: sa.Connection, database: str) -> dict[str, Any]:
    """The server's deadlock counter now: PostgreSQL's of ``database``; MySQL/MariaDB's of the whole
    server, with whether InnoDB's latest detected deadlock names ``database`` (None: unreadable)."""
    if conn.dialect.name == "postgresql":
        # A fresh snapshot: the statistics are cached per transaction by default.
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        value = fetch(conn, "SELECT deadlocks FROM pg_stat_database WHERE datname = :name", name=database)
        return {"server": int(value[0][0] or 0), "server_scope": "database", "latest_names_database": None}
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).first()
    section, spellings = latest_deadlock(conn), (f"`{database}`", f" {database}.", f"`{database}/")
    names = None if section is None else any(n in section for n in spellings)
    return {"server": int(row[1]) if row else 0, "server_scope": "server", "latest_names_database": names}


def deadlock_lines(paths: Iterable[Path]) -> dict[str, int]:
    """Lines matching :data:`DEADLOCK_LINE` per file (files without any left out)."""
    found = {}
    for path in paths:
        with path.open(errors="replace") as lines:
            found[str(path)] = sum(1 for line in lines if DEADLOCK_LINE.search(line))
    return {path: n for path, n in found.items() if n}


def plugin_line(api_server_log: Path) -> str | None:
    """The plug-in's start-up line in the api-server's log (names its on_conflict policy), if any."""
    with api_server_log.open(errors="replace") as lines:
        for line in lines:
            if "airflow-adrq: " in line and "on_conflict=" in line:
                return line.split("airflow-adrq: ", 1)[1].split(" [", 1)[0].strip()
    return None


# A task-state call's ``request finished`` line of the api-server's access log (Airflow 3.3's
# HttpAccessLogMiddleware: duration_us from the request's arrival to the end of its response);
# structlog prints the fields sorted by name.
_STATE_CALL = re.compile(
    r"^(?P<at>\S+) .*request finished.* duration_us=(?P<us>\d+) .*method=PATCH "
    r"path=/execution/task-instances/(?P<ti>[0-9a-fA-F-]{32,36})/state .*status_code=(?P<status>\d+)"
)


class AccessRecord(NamedTuple):
    """One ``PATCH /execution/task-instances/{id}/state`` line of the access log; ``at``: when it
    was logged (the response sent), from the line's leading timestamp."""

    ti_id: str
    status: int
    duration_ms: float
    at: dt.datetime | None = None


def parse_access_log(path: Path) -> list[AccessRecord]:
    """The task-state calls in the api-server's log (its ``request finished`` lines)."""
    with path.open(errors="replace") as lines:
        found = [m for m in map(_STATE_CALL.match, lines) if m]
    return [
        AccessRecord(_uuid_hex(m["ti"]), int(m["status"]), int(m["us"]) / 1000, _at(m["at"])) for m in found
    ]


def state_calls(
    api_server_log: Path, bursts: Sequence[dict[str, Any]], run_of: dict[str, str]
) -> dict[str, Any]:
    """The producer tasks' success calls (``run_of``: their burst by task instance id) from the access
    log: their latency, and per burst when its last one was answered, which is when it is done (a
    task's ``end_date`` is the task SDK's, stamped before that call)."""
    records = parse_access_log(api_server_log)
    for burst in bursts:
        ends = [r.at for r in records if r.at is not None and run_of.get(r.ti_id) == burst["run_id"]]
        burst["last_state_call_at"] = max(ends).isoformat() if ends else None
        burst["trigger_to_done_s"] = _seconds(burst["triggered_at"], burst["last_state_call_at"])
        burst["trigger_to_end_date_s"] = _seconds(burst["triggered_at"], burst["last_end"])
    return {"patch_state": latency_summary(records, run_of), "patch_state_all_calls": len(records)}


# Any request's ``request finished`` line (the same middleware's as :data:`_STATE_CALL`).
_REQUEST = re.compile(
    r"^(?P<at>\S+) .*request finished.* duration_us=(?P<us>\d+) .*method=(?P<method>\S+) path=(?P<path>\S+)"
)


def in_flight(api_server_log: Path, bursts: Sequence[dict[str, Any]]) -> dict[str, int | None]:
    """The most requests the api-server had in flight at once during the bursts (from the first
    trigger to the last burst's last task-state call; a request's arrival is its logged end minus its
    duration): all of them, and the task-state calls alone (None: no burst was answered)."""
    ends = [b["last_state_call_at"] for b in bursts if b["last_state_call_at"]]
    if not bursts or not ends:
        return {"all": None, "patch_state": None}
    start, stop = _at(bursts[0]["triggered_at"]), _at(max(ends))
    spans: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {"all": [], "patch_state": []}
    with api_server_log.open(errors="replace") as lines:
        for found in map(_REQUEST.match, lines):
            end = _at(found["at"]) if found else None
            if found is None or end is None or start is None or stop is None:
                continue
            arrived = end - dt.timedelta(microseconds=int(found["us"]))
            if start <= arrived <= stop:
                spans["all"].append((arrived, end))
                if found["method"] == "PATCH" and found["path"].endswith("/state"):
                    spans["patch_state"].append((arrived, end))
    return {kind: _most_at_once(found) for kind, found in spans.items()}


def _most_at_once(spans: Sequence[tuple[dt.datetime, dt.datetime]]) -> int:
    """The most of ``spans`` (start, end) that overlap at one instant (one ending as another starts: not)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def latency_summary(records: Sequence[AccessRecord], ti_ids: Collection[str]) -> dict[str, Any]:
    """p25 / p50 / p75 / p99 / max (ms, nearest rank) and the status codes of these task instances' calls."""
    mine = [r for r in records if r.ti_id in ti_ids]
    durations = [r.duration_ms for r in mine]
    return {
        "calls": len(mine),
        **{f"p{q}_ms": percentile(durations, q) for q in (25, 50, 75, 99)},
        "max_ms": percentile(durations, 100),
        "status": dict(sorted(Counter(str(r.status) for r in mine).items())),
    }


def _uuid_hex(value: object) -> str:
    """A UUID in one spelling (32 hex digits): PostgreSQL returns it dashed, MySQL as CHAR(32)."""
    return uuid.UUID(str(value)).hex


def _at(stamp: str) -> dt.datetime | None:
    """The ISO timestamp a structlog console line starts with (``2026-01-01T00:00:00.123456Z``)."""
    with contextlib.suppress(ValueError):
        return _utc(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")))
    return None


def _utc(value: dt.datetime) -> dt.datetime:
    """A timestamp as an aware UTC datetime (MySQL's come back naive, in UTC)."""
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _seconds(start: str, end: str | None) -> float | None:
    span = None if end is None else dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)
    return None if span is None else round(span.total_seconds(), 2)
