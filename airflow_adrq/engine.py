"""Engines configured the way the locking guarantees assume."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from airflow_adrq import dialects

__all__ = ["create_engine"]


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` plus the backend's settings (:mod:`airflow_adrq.dialects`).

    PostgreSQL: unchanged (READ COMMITTED, the server default); MySQL/MariaDB:
    READ COMMITTED, as Airflow sets it; SQLite: ``BEGIN IMMEDIATE``, a busy
    timeout and ``PRAGMA foreign_keys=ON``. Explicit ``kwargs`` win.
    """
    url = sa.engine.make_url(url)
    backend = dialects.get(url.get_backend_name())
    engine = sa.create_engine(url, **{**backend.engine_kwargs, **kwargs})
    backend.configure_engine(engine)
    return engine
