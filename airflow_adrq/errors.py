"""Exceptions raised by airflow-adrq."""

from __future__ import annotations

__all__ = [
    "AdrqError",
    "AirflowSchemaError",
    "CommitOutcomeUnknownError",
    "DeferredTooLateError",
    "DriverNotInstalledError",
    "IsolationLevelError",
    "LockWaitTimeoutError",
    "RetriesExhaustedError",
    "UnsupportedDialectError",
    "UnsupportedSchemaError",
]


class AdrqError(Exception):
    """airflow-adrq error."""

    def __init__(self, message: str | None = None) -> None:
        # The class docstring is the default message (procrastinate's habit).
        super().__init__(message or self.__doc__)


class UnsupportedDialectError(AdrqError):
    """This database backend is not supported by airflow-adrq."""


class DriverNotInstalledError(AdrqError, ImportError):
    """The URL's database driver (DBAPI module) is not installed."""


class UnsupportedSchemaError(AdrqError):
    """The asset_dag_run_queue table does not have a shape airflow-adrq knows how to write."""


class AirflowSchemaError(AdrqError):
    """Refusing to run airflow-adrq migrations against a database that holds Airflow's own schema."""


class RetriesExhaustedError(AdrqError):
    """The transaction kept failing with retryable database errors; ``attempts``: how many were made."""

    def __init__(self, message: str, *, attempts: int = 0) -> None:
        super().__init__(message)
        self.attempts = attempts


class IsolationLevelError(AdrqError):
    """The connection's transaction isolation level breaks the locking guarantees."""


class DeferredTooLateError(AdrqError):
    """A queue write was deferred after the transaction's commit-time write had already run."""


class CommitOutcomeUnknownError(AdrqError):
    """The connection was lost while COMMIT was in flight: the transaction may or may not be committed.

    ``event_ids``: the ``asset_event`` ids the transaction registered, to look
    for (:func:`airflow_adrq.retry.commit_outcome`).
    """

    event_ids: tuple[int, ...] = ()


class LockWaitTimeoutError(AdrqError):
    """The queue write waited ``lock_wait_s`` for its consumers' ``dag`` rows, which others kept holding."""
