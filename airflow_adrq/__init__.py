"""airflow-adrq: deadlock-free, set-based ``asset_dag_run_queue`` writes for Apache Airflow.

Guarantee, in one paragraph: every transaction queues all the downstream DAGs
of all the asset events it registered with ONE ``INSERT ... SELECT ... ORDER
BY asset_id, dag_id`` statement driven by its own ``asset_event`` rows, run
just before its COMMIT, so concurrent producers lock queue rows in the same
global order and cannot deadlock on them; the rows appear when the
transaction commits and never if it rolls back, and the events' ``timestamp``
and the rows' ``created_at`` are stamped together just before COMMIT.
Deadlocks through other tables remain possible: run producer transactions
under :func:`run_in_transaction`, which retries them from BEGIN.

Public API (every name in ``__all__``; anything else is internal):

* :func:`register_asset_change`, :func:`register_asset_changes`,
  :class:`AssetChange` — Airflow 3.3's ``AssetManager.register_asset_change``,
  standalone.
* :func:`defer_events` (at COMMIT), :func:`queue_events` (now),
  :func:`flush_queue`, :func:`queue_dagruns` (by asset id, without events),
  :func:`build_queue_statement` — the queueing statement.
* :func:`run_in_transaction`, :func:`classify` — whole-transaction retry.
* :func:`create_engine` — an engine with the settings the guarantees assume.
* :func:`add_listener`, :func:`remove_listener`, :class:`AssetEventInfo` —
  post-commit listeners.
* The exceptions, all subclasses of :class:`AdrqError`.
"""

from __future__ import annotations

import sqlalchemy as _sqlalchemy

# Before anything else imports SQLAlchemy 2 names: a clear reason instead of
# "cannot import name 'Select'" (Airflow 3.0 pins SQLAlchemy < 2.0).
if int(_sqlalchemy.__version__.split(".")[0]) < 2:
    raise ImportError(
        f"airflow-adrq needs SQLAlchemy 2.0 or later, found {_sqlalchemy.__version__} (Airflow 3.0 pins "
        "SQLAlchemy < 2.0: the Airflow plug-in supports Airflow 3.1 and later)"
    )

from airflow_adrq.engine import create_engine
from airflow_adrq.errors import (
    AdrqError,
    AirflowSchemaError,
    CommitOutcomeUnknownError,
    DeferredTooLateError,
    IsolationLevelError,
    RetriesExhaustedError,
    UnsupportedDialectError,
    UnsupportedSchemaError,
)
from airflow_adrq.listeners import AssetEventInfo, add_listener, remove_listener
from airflow_adrq.manager import AssetChange, register_asset_change, register_asset_changes
from airflow_adrq.queue import (
    build_queue_statement,
    defer_events,
    flush_queue,
    queue_dagruns,
    queue_events,
)
from airflow_adrq.retry import classify, run_in_transaction

__version__ = "0.1.0"

__all__ = [
    "AdrqError",
    "AirflowSchemaError",
    "AssetChange",
    "AssetEventInfo",
    "CommitOutcomeUnknownError",
    "DeferredTooLateError",
    "IsolationLevelError",
    "RetriesExhaustedError",
    "UnsupportedDialectError",
    "UnsupportedSchemaError",
    "__version__",
    "add_listener",
    "build_queue_statement",
    "classify",
    "create_engine",
    "defer_events",
    "flush_queue",
    "queue_dagruns",
    "queue_events",
    "register_asset_change",
    "register_asset_changes",
    "remove_listener",
    "run_in_transaction",
]
