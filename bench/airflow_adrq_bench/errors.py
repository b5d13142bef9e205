"""The benchmark's one error type; each mode's errors are subclasses of it."""

from airflow_adrq.errors import AdrqError


class BenchError(AdrqError):
    """A benchmark could not run (no database, a worker died, a deployment failed ...)."""
