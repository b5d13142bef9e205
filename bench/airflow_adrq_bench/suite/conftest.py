"""One ``party`` parameter per party of the plan named by ``ADRQ_BENCH_PLAN``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_adrq_bench.config import Plan

PLAN_ENV = "ADRQ_BENCH_PLAN"


def _plan() -> Plan:
    path = os.environ.get(PLAN_ENV)
    if not path:
        raise pytest.UsageError(
            f"{PLAN_ENV} is not set: run the benchmark with `airflow-adrq bench` "
            "(it writes the plan and starts this suite under pytest-xdist)"
        )
    return Plan.load(Path(path))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "party" in metafunc.fixturenames:
        parties = _plan().parties
        metafunc.parametrize("party", range(parties), ids=[f"party{p}" for p in range(parties)])


@pytest.fixture(scope="session")
def plan() -> Plan:
    return _plan()
