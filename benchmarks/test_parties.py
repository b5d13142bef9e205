# mypy: ignore-errors
"""One benchmark party per xdist worker (the packaged suite's test)."""

from airflow_adrq_bench.suite.test_parties import test_party  # noqa: F401
