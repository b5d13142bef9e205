# mypy: ignore-errors
"""Thin entry to the packaged suite: parametrize parties from ``ADRQ_BENCH_PLAN``."""

from airflow_adrq.bench.suite.conftest import plan, pytest_generate_tests  # noqa: F401
