"""``--dag-writers``: Airflow's other writers of the consumers' ``dag`` rows, each looping back to back in a
consumer process (:class:`.consumer.Consumer`) of its own while the producers run; :func:`loop` runs there.

* ``dag_processor``: the DAG processor's save of a parsed file, the cell's DAGs (those accounted and the
  extra ones): ``LazyDeserializedDAG.from_dag`` then ``update_dag_parsing_results_in_db`` (its
  ``DagModelOperation.find_orm_dags`` locks every row ``FOR NO KEY UPDATE`` / ``FOR UPDATE``, then updates
  them) and COMMIT, as the DAG processor's manager does after each parse;
* ``pause``: what ``PATCH /api/v2/dags/{dag_id}`` (``patch_dag``) runs, pausing then unpausing each extra
  DAG in turn: ``session.get(DagModel, dag_id)``, ``is_paused`` set, COMMIT (the route's action log row
  is left out);
* ``bulk``: what the bulk ``PATCH /api/v2/dags?dag_id_pattern=<cell>`` (``patch_dags``) runs with
  ``is_paused=false``: its page ``SELECT``, then ``UPDATE dag SET is_paused=false WHERE dag_id IN (SELECT
  dag_id FROM dag WHERE dag_id ILIKE '%<cell>%' AND NOT is_stale)``, COMMIT: every row of the cell is
  locked; the accounted DAGs stay unpaused (nothing changes for them), the extra ones are unpaused.

Only the extra DAGs are ever paused, so the accounted DAGs' events are still owed a run each."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from airflow_adrq.retry import classify
from airflow_adrq_bench.airflow_mode.accounting import consumer

#: The writers, in the order they start.
KINDS = ("dag_processor", "pause", "bulk")


def _dag_processor(
    schedules: dict[str, list[str]], _extra: list[str], _pattern: str
) -> Callable[[Any], None]:
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    def write(session: Any) -> None:
        serialized = [LazyDeserializedDAG.from_dag(dag) for dag in consumer.dags(schedules)]
        update_dag_parsing_results_in_db(consumer.BUNDLE, None, serialized, {}, None, set(), session=session)

    return write


def _pause(_schedules: dict[str, list[str]], extra: list[str], _pattern: str) -> Callable[[Any], None]:
    from airflow.models.dag import DagModel

    turns = itertools.cycle([(dag_id, paused) for dag_id in extra for paused in (True, False)])

    def write(session: Any) -> None:
        dag_id, paused = next(turns)
        dag = session.get(DagModel, dag_id)
        dag.is_paused = paused

    return write


def _bulk(_schedules: dict[str, list[str]], _extra: list[str], pattern: str) -> Callable[[Any], None]:
    from airflow.models.dag import DagModel

    where = (DagModel.dag_id.ilike(f"%{pattern}%"), ~DagModel.is_stale)

    def write(session: Any) -> None:
        session.scalars(sa.select(DagModel).where(*where).limit(50)).all()
        ids = sa.select(DagModel.dag_id).where(*where).subquery()
        session.execute(
            sa.update(DagModel)
            .where(DagModel.dag_id.in_(sa.select(ids.c.dag_id)))
            .values(is_paused=False)
            .execution_options(synchronize_session="fetch")
        )

    return write


_WRITERS = {"dag_processor": _dag_processor, "pause": _pause, "bulk": _bulk}


def loop(kind: str, schedules: dict[str, list[str]], extra: list[str], pattern: str) -> dict[str, Any]:
    """Write as ``kind`` back to back, each write a transaction, until the controller sets ``stop`` (sets
    ``started`` after the first); the writes made, their durations, the errors that failed a write
    (``errors``: it is dropped and the next one made, as the next parse or request would be) and every
    database error its connections raised (``db_errors``: also those Airflow's own retries replayed)."""
    write = _WRITERS[kind](schedules, extra, pattern)
    me = consumer._consumer
    me.db_errors.clear()
    errors: Counter[str] = Counter()
    ms: list[float] = []
    while True:
        start = time.perf_counter()
        with me.session_factory() as session:
            try:
                write(session)
                session.commit()
            except Exception as exc:
                session.rollback()
                found = classify(exc)
                errors[found.kind.value if found else type(exc).__name__] += 1
        ms.append((time.perf_counter() - start) * 1000)
        me.started.set()
        if me.stop.is_set():
            break
    ms.sort()
    made: dict[str, Any] = {"kind": kind, "writes": len(ms), "p50_ms": ms[len(ms) // 2], "max_ms": ms[-1]}
    return made | {"errors": dict(errors), "db_errors": dict(me.db_errors)}
