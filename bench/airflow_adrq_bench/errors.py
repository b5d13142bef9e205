"""The benchmark's one error type; each mode's errors are subclasses of it."""

from __future__ import annotations

from airflow_adrq.errors import AdrqError

__all__ = ["BenchError"]


class BenchError(AdrqError):
    """A benchmark could not run (no database, a worker died, a deployment failed ...)."""
