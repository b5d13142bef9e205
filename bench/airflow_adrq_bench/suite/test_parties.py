"""The pytest-xdist suite of the standalone run: one test per party, one xdist worker per test.

:mod:`airflow_adrq_bench.runner` runs it as ``python -m pytest --pyargs airflow_adrq_bench.suite -n
<producers + 1>`` with ``ADRQ_BENCH_PLAN`` naming the plan JSON. With as many tests as workers, xdist's
load scheduler deals the tests round robin (fewer than two per worker), so every party is a process of
its own: party 0 the coordinator, 1..N the producers (:mod:`airflow_adrq_bench.engine`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from airflow_adrq_bench import barrier, engine
from airflow_adrq_bench.config import Plan
from airflow_adrq_bench.runner import PLAN_ENV


@functools.cache
def _plan() -> Plan:
    if not (path := os.environ.get(PLAN_ENV)):
        raise pytest.UsageError(
            f"{PLAN_ENV} is not set: run the benchmark with `airflow-adrq bench` "
            "(it writes the plan and starts this suite under pytest-xdist)"
        )
    return Plan.load(Path(path))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One ``party`` parameter per party of the plan."""
    metafunc.parametrize("party", range(_plan().parties), ids="party{}".format)


def test_party(party: int) -> None:
    assert os.environ.get("PYTEST_XDIST_WORKER"), "the benchmark suite runs under pytest-xdist (-n)"
    plan = _plan()
    try:
        if party == 0:
            engine.run_coordinator(plan)
        else:
            engine.run_producer(plan, party)
    except BaseException:
        # The others stop at their next barrier instead of waiting there until it times out.
        barrier.abort(Path(plan.out_dir) / "barriers")
        raise
