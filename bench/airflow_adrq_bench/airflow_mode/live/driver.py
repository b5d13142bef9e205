"""Drive a started deployment: wait until it is ready, warm it up, trigger the bursts, drain, count.

Everything goes through the deployment's public interfaces, as an operator's
tooling would: the REST API (``GET /auth/token``, which ``[core]
simple_auth_manager_all_admins`` opens; ``POST /api/v2/dags/{id}/dagRuns``;
``POST /api/v2/assets/events``) for what Airflow does, and read-only SQL on
the scratch database (:mod:`.measure`) for what the driver waits for and
counts. Every wait checks the deployment's hard time limit and that no
component has exited, and updates a progress line on stderr.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.databases import fetch, queue_rows
from airflow_adrq_bench.airflow_mode.live import measure
from airflow_adrq_bench.airflow_mode.live.config import (
    WARM_DAG,
    Deadline,
    LiveError,
    LiveSizes,
    asset_names,
    burst_run_id,
    consumer_dag_ids,
    producer_dag_ids,
)
from airflow_adrq_bench.airflow_mode.live.deployment import Deployment

__all__ = ["Api", "Driver", "Progress", "seconds_between"]

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
        references = self.sizes.consumers * self.sizes.outlets
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
                queue, runs = queue_rows(conn), measure.run_count(conn, self.consumers)
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

    def _after(self, conn: sa.Connection, *, states: bool = False) -> dict[str, Any]:
        """The pairs, the consumer runs (their states) and the queue rows after a drain."""
        pairs = measure.count_pairs(conn, self.producers, self.consumers, self.run_ids)
        out: dict[str, Any] = {**pairs.as_dict(), "consumer_runs": measure.run_count(conn, self.consumers)}
        if states:
            out["consumer_run_states"] = measure.counts(
                conn, measure.CONSUMER_RUN_STATES, dag_ids=self.consumers
            )
        return {**out, "queue_rows": queue_rows(conn)}


def seconds_between(start: str, end: str | None) -> float | None:
    """Seconds from ISO timestamp ``start`` to ``end`` (None without an end)."""
    if end is None:
        return None
    return round((dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds(), 2)
