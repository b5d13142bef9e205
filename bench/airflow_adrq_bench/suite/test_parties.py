"""Party 0 coordinates the rounds (and consumes the queue); parties 1..N are the producers."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_adrq_bench import barrier, engine
from airflow_adrq_bench.config import Plan


def test_party(plan: Plan, party: int) -> None:
    assert os.environ.get("PYTEST_XDIST_WORKER"), "the benchmark suite runs under pytest-xdist (-n)"
    try:
        if party == 0:
            engine.run_coordinator(plan)
        else:
            engine.run_producer(plan, party)
    except BaseException:
        # The others stop at their next barrier instead of waiting there until it times out.
        barrier.abort(Path(plan.out_dir) / "barriers")
        raise
