"""``--pause-churn``: the writers of ``dag`` that operators have, through the REST API, while the bursts run.

A thread loops, :data:`GAP_S` between requests: the bulk ``PATCH /api/v2/dags`` with ``is_paused=false``
over the consumers that are not paused (Airflow 3.3.2 sends one Core ``UPDATE dag SET is_paused ...
WHERE dag_id IN (...)``: it locks every such consumer's row and changes nothing), then ``PATCH
/api/v2/dags/{id}`` pausing and unpausing one of the :func:`toggled` consumers in turn (the route sets
the ORM attribute: an ``UPDATE`` only when the value changes, so only a real toggle locks the row). An
event emitted while its consumer is paused is not queued for it, by design: the toggled consumers
are left out of the accounting, and unpaused when the churn stops.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, NamedTuple

import httpx

from airflow_adrq_bench.airflow_mode.config import LiveError
from airflow_adrq_bench.stats import percentile

#: Seconds between two churn requests (the api-server serves the task-success calls too).
GAP_S: Final = 0.1
#: What the bulk PATCH selects: every consumer (an ILIKE '%...%' pattern) that is not paused.
BULK_QUERY: Final = {"dag_id_pattern": "adrq_live_consumer_", "paused": "false", "update_mask": "is_paused"}


def toggled(consumer_ids: Sequence[str]) -> list[str]:
    """The consumers the churn pauses and unpauses: the last one of every 8 (at least the last one)."""
    return sorted(consumer_ids[::-8])


class Call(NamedTuple):
    """One churn request: ``bulk`` or ``pause`` / ``unpause``, its HTTP status (0: no answer), its time."""

    kind: str
    status: int
    ms: float


def summarize(calls: Sequence[Call]) -> dict[str, Any]:
    """The churn's requests: in all and per kind, how many, the status codes, p50 / p99 / max in ms (as
    the client measured them, request sent to answer read)."""

    def of(mine: Sequence[Call]) -> dict[str, Any]:
        durations = [c.ms for c in mine]
        return {
            "calls": len(mine),
            "not_2xx": sum(not 200 <= c.status < 300 for c in mine),
            "5xx": sum(500 <= c.status < 600 for c in mine),
            **{f"p{q}_ms": percentile(durations, q) for q in (50, 99)},
            "max_ms": percentile(durations, 100),
            "status": dict(sorted(Counter(str(c.status) for c in mine).items())),
        }

    kinds = sorted({c.kind for c in calls})
    return {**of(calls), "kinds": {k: of([c for c in calls if c.kind == k]) for k in kinds}}


class Churn:
    """The churn's thread, running while entered; leaving stops it and unpauses the toggled consumers."""

    def __init__(self, base_url: str, headers: httpx.Headers, consumer_ids: Sequence[str]) -> None:
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=60.0, trust_env=False)
        self.toggled, self.calls = toggled(consumer_ids), list[Call]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adrq-live-pause-churn", daemon=True)

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        try:
            for dag_id in self.toggled:  # every toggled consumer unpaused, or the drain would wait forever
                if (last := self._send("unpause", dag_id)).status != 200:
                    raise LiveError(f"the pause churn could not unpause {dag_id}: HTTP {last.status}")
        finally:
            self.http.close()

    def _run(self) -> None:
        for dag_id in itertools.cycle(self.toggled):
            for kind, target in (("bulk", None), ("pause", dag_id), ("unpause", dag_id)):
                if self._stop.wait(GAP_S):
                    return
                self.calls.append(self._send(kind, target))

    def _send(self, kind: str, dag_id: str | None) -> Call:
        """One request (``bulk``: over the unpaused consumers; else ``dag_id`` paused or unpaused)."""
        body = {"is_paused": kind == "pause"}
        path, params = ("/api/v2/dags", BULK_QUERY) if dag_id is None else (f"/api/v2/dags/{dag_id}", {})
        started = time.monotonic()
        try:
            status = self.http.patch(path, params=params, json=body).status_code
        except httpx.HTTPError:
            status = 0
        return Call(kind, status, round((time.monotonic() - started) * 1000, 1))
