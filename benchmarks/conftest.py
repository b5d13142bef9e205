# mypy: ignore-errors
"""Thin entry to the packaged suite: parametrize parties from ``ADRQ_BENCH_PLAN``."""

from airflow_adrq_bench.suite.conftest import plan, pytest_generate_tests  # noqa: F401
