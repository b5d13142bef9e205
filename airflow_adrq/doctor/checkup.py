""":func:`check`: the compatibility and exposure read in one read-only transaction, then the verdict."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL, Inspector
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.doctor import backends, compatibility, exposure, verdict
from airflow_adrq.doctor.connection import read_only_connection
from airflow_adrq.doctor.report import DoctorError, Report, first_line

__all__ = ["check"]


def check(url: str | URL, schema: str | None = None) -> Report:
    """Read the Airflow metadata database at ``url`` (read-only) and return the report.

    ``schema``: where Airflow's tables are, if not in the default schema
    (``[database] sql_alchemy_schema``; PostgreSQL).

    Raises :class:`DoctorError` when it is no Airflow metadata database or
    cannot be read.
    """
    url = sa.make_url(url)
    probe = backends.get(url)
    try:
        with read_only_connection(url, schema) as conn:
            inspector = sa.inspect(conn)
            tables = _tables(inspector, schema)
            compat, shape, warnings = compatibility.read(conn, probe, inspector, tables, schema)
            exposed = None
            if tables >= exposure.TABLES:
                # A schema the plug-in cannot write still has an exposure.
                exposed = exposure.read(conn, tables, shape or exposure.fallback_shape(inspector, schema))
                warnings.extend(probe.stats(conn, exposed))
    except SQLAlchemyError as exc:
        raise DoctorError(f"cannot read {_safe(url)}: {first_line(exc)}") from exc
    if exposed is None and compat.supported:
        # Supported schemas always have these tables.
        raise DoctorError("the asset and schedule-reference tables are missing: not an Airflow 3 database")
    decided, reasons = verdict.decide(compat, exposed)
    return Report(_safe(url), compat, exposed, decided, reasons, warnings)


def _tables(inspector: Inspector, schema: str | None) -> set[str]:
    tables = set(inspector.get_table_names(schema=schema))
    if schema and "alembic_version" not in tables:
        # Airflow's migrations keep their version table in the default schema.
        tables |= {"alembic_version"} & set(inspector.get_table_names())
    return tables


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)
