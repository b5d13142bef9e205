"""What runs in the Airflow mode's worker processes for ``--db-cost``: task successes as Airflow makes them.

A task success is Airflow 3.3.2's Execution API route ``ti_update_state`` (``PATCH
/execution/task-instances/{id}/state`` with a ``TISuccessStatePayload``), called as a function with the
worker's session: ``SELECT ... FOR UPDATE`` of the task instance, ``register_asset_changes_in_db`` (the
process's ``[core] asset_manager_class``), ``UPDATE task_instance``, ``INSERT INTO log``, ``COMMIT``, then
Airflow's asset callbacks. Only the HTTP layer is left out. Each call needs a RUNNING task instance of
its own: :func:`seed` makes them (outside the measured window).
"""

from __future__ import annotations

import datetime as dt
import re
import time
import warnings
from collections import Counter, defaultdict
from typing import Any

from airflow_adrq.retry import classify
from airflow_adrq_bench.airflow_mode import worker
from airflow_adrq_bench.airflow_mode.worker import PRODUCER_DAG, asset_uri

#: How long one task success may be retried after a retryable database error raised out of the route
#: (the Task SDK's client retries the PATCH the same way, on HTTP 5xx).
RETRY_FOR_S = 120.0


def seed(run_id: str, task_ids: list[str]) -> list[str]:
    """A running DAG run of the producing DAG with one RUNNING task instance per ``task_ids``; their ids."""
    import sqlalchemy as sa
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance, uuid7
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    now = dt.datetime.now(dt.timezone.utc)
    ids = [uuid7() for _ in task_ids]
    rows = [
        {
            "id": ti_id,
            "dag_id": PRODUCER_DAG,
            "run_id": run_id,
            "task_id": task_id,
            "map_index": -1,
            "try_number": 1,
            "max_tries": 0,
            "state": "running",
            "start_date": now,
            "pool": "default_pool",
            "pool_slots": 1,
            "queue": "default",
            "priority_weight": 1,
            "hostname": "adrq-bench",
        }
        for ti_id, task_id in zip(ids, task_ids, strict=True)
    ]
    with worker._worker.session_factory() as session:
        run = DagRun(
            dag_id=PRODUCER_DAG,
            run_id=run_id,
            run_type=DagRunType.MANUAL,
            state=DagRunState.RUNNING,
            run_after=now,
            start_date=now,
            triggered_by=DagRunTriggeredByType.TEST,
        )
        session.add(run)
        session.flush()  # the task instances' FK to their run
        session.execute(sa.insert(TaskInstance.__table__), rows)
        session.commit()
    return [str(ti_id) for ti_id in ids]


def succeed(
    ti_ids: list[str], assets: list[str], start_at: float | None = None, redo_probe: str | None = None
) -> dict[str, Any]:
    """Each task instance of ``ti_ids`` succeeds in turn, the one at index ``i`` emitting ``assets[i]``,
    from ``start_at`` (wall clock: the other producers start then too). Per call its seconds and
    statements, with the attempts and what ended the failed ones (a retry follows a retryable error
    raised out of the route; Airflow's own handling, which marks the task FAILED, is left to Airflow);
    with ``redo_probe`` (a MariaDB URL; one caller only) the redo each statement wrote."""
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    probe = RedoProbe.on(redo_probe) if redo_probe else None
    calls = [_one(ti_id, asset, probe) for ti_id, asset in zip(ti_ids, assets, strict=True)]
    return {"calls": calls}


class RedoProbe:
    """Per statement this process sends, the redo InnoDB wrote meanwhile: ``Innodb_lsn_current`` read on a
    connection of its own before and after it (so: one caller at a time, nothing else writing). What a
    call wrote between its statements after its COMMIT began is the COMMIT's."""

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa
        from sqlalchemy.pool import NullPool

        self.conn = sa.create_engine(url, poolclass=NullPool).connect()
        self.active = False
        self.last, self.gap = 0, ""
        self.found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for name, listener in (
            ("before_cursor_execute", self.before),
            ("after_cursor_execute", self.after),
            ("commit", self.commit),
        ):
            sa.event.listen(worker._worker.engine, name, listener)

    @classmethod
    def on(cls, url: str) -> RedoProbe:
        """This process's probe of ``url`` (listening on the worker's engine from its first use)."""
        if url not in _PROBES:
            _PROBES[url] = cls(url)
        return _PROBES[url]

    def lsn(self) -> int:
        return int(self.conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'").one()[1])

    def start(self) -> None:
        self.active, self.last, self.gap = True, self.lsn(), "(between statements)"
        self.found.clear()

    def finish(self) -> dict[str, list[int]]:
        self._add(self.gap, self.lsn(), calls=0)
        self.active = False
        return dict(self.found)

    def _add(self, label: str, now: int, calls: int = 1) -> None:
        self.found[label][0] += calls
        self.found[label][1] += now - self.last
        self.last = now

    def before(self, *_args: Any) -> None:
        if self.active:
            self._add(self.gap, self.lsn(), calls=0)

    def after(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.active:
            self._add(statement_label(statement), self.lsn())

    def commit(self, _conn: Any) -> None:
        if self.active:
            self._add(self.gap, self.lsn(), calls=0)
            self.gap = "COMMIT"


#: This process's probes, per URL.
_PROBES: dict[str, RedoProbe] = {}


def statement_label(statement: str) -> str:
    """A statement as the traces group it: whitespace collapsed, numbers as N, its first 70 characters."""
    text = re.sub(r"\d+", "N", re.sub(r"\s+", " ", statement).strip())
    return text[:70] + ("..." if len(text) > 70 else "")


def _one(ti_id: str, asset: str, probe: RedoProbe | None) -> dict[str, Any]:
    from uuid import UUID

    from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
    from airflow.api_fastapi.execution_api.datamodels.taskinstance import TISuccessStatePayload
    from airflow.utils.state import TerminalTIState

    with warnings.catch_warnings():  # the routes' first import warns of Starlette's test client, unused
        warnings.filterwarnings("ignore", message=r".*starlette\.testclient")
        from airflow.api_fastapi.execution_api.routes.task_instances import ti_update_state

    # The route reads Airflow's DAG bag only to fail a task fast: never on success.
    no_dag_bag: Any = None
    failures: Counter[str] = Counter()
    start = time.monotonic()
    deadline = start + RETRY_FOR_S
    while True:
        payload = TISuccessStatePayload(
            state=TerminalTIState.SUCCESS,
            end_date=dt.datetime.now(dt.timezone.utc),
            task_outlets=[AssetProfile(name=asset, uri=asset_uri(asset), type="Asset")],
            outlet_events=[],
        )
        worker._worker.statements = 0
        if probe is not None:
            probe.start()
        with worker._worker.session_factory() as session:
            try:
                ti_update_state(UUID(ti_id), payload, session=session, dag_bag=no_dag_bag)
            except Exception as exc:
                session.rollback()
                retryable = classify(exc)
                if retryable is None or time.monotonic() > deadline:
                    raise
                failures[retryable.kind.value] += 1
                continue
        seconds, statements = time.monotonic() - start, worker._worker.statements
        attempts = sum(failures.values()) + 1
        found = {"s": seconds, "statements": statements, "attempts": attempts, "failures": dict(failures)}
        return found | ({"redo": probe.finish()} if probe is not None else {})
