"""Engines configured the way the locking guarantees assume."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from airflow_adrq import dialects
from airflow_adrq.errors import DriverNotInstalledError

__all__ = ["create_engine", "driver_not_installed"]


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine`` plus the backend's settings (:mod:`airflow_adrq.dialects`).

    PostgreSQL: unchanged (READ COMMITTED, the server default); MySQL/MariaDB:
    READ COMMITTED, as Airflow sets it; SQLite: ``BEGIN IMMEDIATE``, a busy
    timeout and ``PRAGMA foreign_keys=ON``. Explicit ``kwargs`` win.
    """
    url = sa.engine.make_url(url)
    backend = dialects.get(url.get_backend_name())
    try:
        engine = sa.create_engine(url, **{**backend.engine_kwargs, **kwargs})
    except ImportError as exc:
        raise driver_not_installed(url, exc) from exc
    backend.configure_engine(engine)
    return engine


def driver_not_installed(url: URL, exc: ImportError) -> DriverNotInstalledError:
    """``exc`` (SQLAlchemy importing the URL's driver) as one line naming what to install."""
    extra = dialects.get(url.get_backend_name()).driver_extra
    fix = f"pip install 'airflow-adrq[{extra}]'" if extra else "install the driver"
    return DriverNotInstalledError(
        f"no driver for {url.drivername}:// URLs is installed ({exc}): {fix}, or name an installed "
        "driver in the URL"
    )
