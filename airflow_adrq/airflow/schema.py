"""Which ``asset_dag_run_queue`` shape the connected database has.

Airflow 3.0-3.3 keys the queue by ``(asset_id, target_dag_id)``: one row per
(asset, consumer). Airflow 3.4 (PR #70972, migration 0128) keys it by
``(target_dag_id, asset_event_id)``: one row per (consumer, event). Writing
3.3-shaped rows into a 3.4 table would fail on ``asset_event_id NOT NULL`` at
best; this module finds out before anything is written.
"""

from __future__ import annotations

import threading
import weakref

from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from airflow_adrq.errors import UnsupportedSchemaError

__all__ = ["SUPPORTED_PRIMARY_KEY", "check_queue_shape", "queue_primary_key"]

#: The primary key this plug-in writes (Airflow 3.0-3.3).
SUPPORTED_PRIMARY_KEY = ("asset_id", "target_dag_id")

_cache: weakref.WeakKeyDictionary[Engine, tuple[str, ...]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def queue_primary_key(session: Session, table_name: str, schema: str | None = None) -> tuple[str, ...]:
    """The primary-key columns of ``table_name``, in key order; cached per engine.

    Reads the database catalog through the session's connection (inside the
    caller's transaction; no row locks, catalog reads only), once per engine.
    """
    bind = session.get_bind()
    engine = bind if isinstance(bind, Engine) else bind.engine
    with _lock:
        cached = _cache.get(engine)
    if cached is not None:
        return cached
    pk = inspect(session.connection()).get_pk_constraint(table_name, schema=schema)
    columns = tuple(pk.get("constrained_columns") or ())
    with _lock:
        _cache[engine] = columns
    return columns


def check_queue_shape(session: Session, table_name: str, schema: str | None = None) -> None:
    """Raise :class:`UnsupportedSchemaError` unless the queue is keyed ``(asset_id, target_dag_id)``."""
    columns = queue_primary_key(session, table_name, schema)
    if set(columns) != set(SUPPORTED_PRIMARY_KEY) or len(columns) != len(SUPPORTED_PRIMARY_KEY):
        shape = f"({', '.join(columns)})" if columns else "no primary key"
        raise UnsupportedSchemaError(
            f"{table_name} has primary key {shape}; airflow-adrq's Airflow plug-in only writes the "
            f"Airflow 3.0-3.3 shape ({', '.join(SUPPORTED_PRIMARY_KEY)}). Airflow 3.4's event-keyed "
            "queue is not supported: remove [core] asset_manager_class to use Airflow's own manager."
        )


def clear_cache() -> None:
    """Forget the cached primary keys (tests; after migrating a database in place)."""
    with _lock:
        _cache.clear()
