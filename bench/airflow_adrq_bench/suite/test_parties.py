"""One benchmark party per xdist worker (see the package docstring)."""

from __future__ import annotations

import os

from airflow_adrq_bench import engine
from airflow_adrq_bench.config import Plan


def test_party(plan: Plan, party: int) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    assert worker is not None, "the benchmark suite must run under pytest-xdist (-n)"
    if party == 0:
        engine.run_coordinator(plan)
    else:
        engine.run_producer(plan, party)
