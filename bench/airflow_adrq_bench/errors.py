from airflow_adrq.errors import AdrqError


class BenchError(AdrqError):
    """A benchmark could not run (no database, a worker died, a deployment failed ...); modes subclass it."""
