"""The one CI switch of the test suite, and the one way a test says it cannot run here (from the test
support's pytest plug-in, which the fixtures use too)."""

from airflow_adrq_testing.pytest_plugin import in_ci, skip_or_fail

__all__ = ["in_ci", "skip_or_fail"]
