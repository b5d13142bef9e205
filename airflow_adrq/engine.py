"""Engines configured the way the locking guarantees assume."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from airflow_adrq import dialects

__all__ = ["create_engine"]


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` plus this backend's required settings.

    * PostgreSQL: unchanged (READ COMMITTED, the server default).
    * MySQL/MariaDB: ``isolation_level="READ COMMITTED"``, as Airflow sets it.
    * SQLite: ``BEGIN IMMEDIATE`` for every transaction, a busy timeout, and
      ``PRAGMA foreign_keys=ON`` (as Airflow sets it).

    Explicit ``kwargs`` win over the backend defaults.
    """
    url = sa.engine.make_url(url)
    support = dialects.get(url.get_backend_name())
    engine = sa.create_engine(url, **{**support.engine_kwargs, **kwargs})
    support.configure_engine(engine)
    return engine
