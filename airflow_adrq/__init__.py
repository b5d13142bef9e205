"""airflow-adrq: deadlock-free, set-based ``asset_dag_run_queue`` writes for Apache Airflow.

Guarantee, in one paragraph: every transaction queues all the downstream DAGs of all the asset events it
registered with ONE ``INSERT ... SELECT ... ORDER BY asset_id, dag_id`` statement driven by its own
``asset_event`` rows, run just before its COMMIT, so concurrent producers lock queue rows in the same
global order and cannot deadlock on them; the rows appear when the transaction commits and never if it
rolls back, and the events' ``timestamp`` and the rows' ``created_at`` get one value of the database's
clock, read just before the rows are written (GUARANTEES.md, "Timing"). Deadlocks through other tables
remain possible: run producer transactions under :func:`run_in_transaction`, which retries them from BEGIN.

Public API (every name in ``__all__``; anything else is internal):

* :func:`register_asset_change`, :func:`register_asset_changes`, :class:`AssetChange` — Airflow 3.3's
  ``AssetManager.register_asset_change``, standalone.
* :func:`defer_events` (at COMMIT), :func:`queue_events` (now), :func:`flush_queue`,
  :func:`queue_dagruns` (by asset id, without events), :func:`build_queue_statement` — the queueing
  statement.
* :func:`run_in_transaction`, :func:`classify` — whole-transaction retry.
* :func:`create_engine` — an engine with the settings the guarantees assume.
* :func:`add_listener`, :func:`remove_listener`, :class:`AssetEventInfo` — post-commit listeners.
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

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from airflow_adrq.deferral import defer_events, flush_queue
    from airflow_adrq.engine import create_engine
    from airflow_adrq.errorcodes import classify
    from airflow_adrq.manager import (
        AssetChange,
        AssetEventInfo,
        add_listener,
        build_queue_statement,
        queue_dagruns,
        register_asset_change,
        register_asset_changes,
        remove_listener,
    )
    from airflow_adrq.queue import queue_events
    from airflow_adrq.retry import run_in_transaction

# Loaded on first access (PEP 562), so that importing a submodule -- the
# Airflow plug-in, airflow_adrq.airflow, in every Airflow process -- loads
# only what that submodule needs (no tenacity, no standalone manager).
_LAZY = {
    "create_engine": "airflow_adrq.engine",
    "classify": "airflow_adrq.errorcodes",
    "AssetEventInfo": "airflow_adrq.manager",
    "add_listener": "airflow_adrq.manager",
    "remove_listener": "airflow_adrq.manager",
    "AssetChange": "airflow_adrq.manager",
    "register_asset_change": "airflow_adrq.manager",
    "register_asset_changes": "airflow_adrq.manager",
    "build_queue_statement": "airflow_adrq.manager",
    "defer_events": "airflow_adrq.deferral",
    "flush_queue": "airflow_adrq.deferral",
    "queue_dagruns": "airflow_adrq.manager",
    "queue_events": "airflow_adrq.queue",
    "run_in_transaction": "airflow_adrq.retry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


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
