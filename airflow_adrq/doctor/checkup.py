""":func:`check`: compatibility and exposure read in one read-only transaction, then the verdict.

Enable when a transaction can write two queue rows that another locks in
the other order (racing producers, multi-outlet tasks, assets with several
consumers, alias events); not needed when none writes two, the queue is
keyed by event, or the backend runs one writer at a time.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.doctor import backends, compatibility, exposure
from airflow_adrq.doctor.report import (
    ENABLE,
    FANOUT_THRESHOLDS,
    NOT_NEEDED,
    NOT_SUPPORTED,
    Compatibility,
    DoctorError,
    Exposure,
    Report,
    count,
    first_line,
)

__all__ = ["check"]


def check(url: str | URL, schema: str | None = None) -> Report:
    """Read the Airflow metadata database at ``url`` (read-only) and return the report.

    ``schema``: where Airflow's tables are, if not in the default schema
    (``[database] sql_alchemy_schema``; PostgreSQL). Raises
    :class:`DoctorError` when it is no Airflow metadata database or cannot be read.
    """
    url = sa.make_url(url)
    safe = url.render_as_string(hide_password=True)
    probe = backends.get(url)
    try:
        with backends.read_only_connection(url, schema) as conn:
            inspector = sa.inspect(conn)
            tables = set(inspector.get_table_names(schema=schema))
            if schema and "alembic_version" not in tables:
                # Airflow's migrations keep their version table in the default schema.
                tables |= {"alembic_version"} & set(inspector.get_table_names())
            compat, shape, warnings = compatibility.read(conn, probe, inspector, tables, schema)
            exposed = None
            if tables >= exposure.TABLES:
                # A schema the plug-in cannot write still has an exposure.
                exposed = exposure.read(conn, tables, shape or exposure.fallback_shape(inspector, schema))
                warnings.extend(probe.stats(conn, exposed))
    except SQLAlchemyError as exc:
        raise DoctorError(f"cannot read {safe}: {first_line(exc)}") from exc
    if exposed is None and compat.supported:
        # Supported schemas always have these tables.
        raise DoctorError("the asset and schedule-reference tables are missing: not an Airflow 3 database")
    return Report(safe, compat, exposed, *_decide(compat, exposed), warnings)


def _decide(compatibility: Compatibility, exposure: Exposure | None) -> tuple[str, list[str]]:
    """``(verdict, reasons)``; ``exposure`` is ``None`` only for a schema that is not supported."""
    if not compatibility.supported:
        return NOT_SUPPORTED, [compatibility.support]
    probe = backends.get(compatibility.backend)
    if probe.cannot_deadlock:
        return NOT_NEEDED, [probe.cannot_deadlock]
    if set(compatibility.queue_key or ()) == {"target_dag_id", "asset_event_id"}:
        reason = (
            "this queue is keyed by (target_dag_id, asset_event_id): concurrent producers insert different "
            "rows and cannot deadlock on them"
        )
        if exposure is not None and exposure.fanout_max > FANOUT_THRESHOLDS[0]:
            reason += (
                "; the plug-in still saves loading every consumer DAG per event "
                f"(up to {exposure.fanout_max:,} here)"
            )
        return NOT_NEEDED, [reason]
    assert exposure is not None
    reasons = []
    if exposure.racing:
        reasons.append(
            f"{count(exposure.racing, 'asset')} with 2+ consumer DAGs produced by several tasks: two "
            "producers lock the same queue rows in Python set order, which differs between processes"
        )
    if exposure.multi_outlet_shared:
        reasons.append(
            f"{count(exposure.multi_outlet_shared, 'task')} with several outlets sharing a consumer DAG: "
            "two runs lock (A, dag) and (B, dag) in opposite orders"
        )
    if exposure.multi_consumer_assets and not exposure.racing:
        reasons.append(
            f"{count(exposure.multi_consumer_assets, 'asset')} with 2+ consumer DAGs (max "
            f"{exposure.fanout_max:,}): events for one of them racing each other (several runs, mapped "
            "tasks, the REST API) lock its queue rows in different orders"
        )
    if exposure.multi_outlet_multirow and not reasons:
        reasons.append(
            f"{count(exposure.multi_outlet_multirow, 'task')} with several outlets queueing 2+ rows per "
            "success: two runs lock them in different orders"
        )
    if exposure.alias_multirow:
        reasons.append(f"{count(exposure.alias_multirow, 'alias', 'aliases')} queueing 2+ rows per event")
    if not reasons:
        if not exposure.assets_with_consumers and not exposure.alias_references:
            return NOT_NEEDED, ["no unpaused DAG is scheduled on an asset: nothing is queued"]
        return NOT_NEEDED, [
            "no transaction can write two queue rows: every asset has at most one consumer DAG, no task's "
            "outlets reach two, and no alias event queues two"
        ]
    if exposure.deadlocks and probe.deadlock_counter:
        reasons.append(
            f"{probe.deadlock_counter} has counted {count(exposure.deadlocks, 'deadlock')} "
            f"({exposure.deadlocks_scope})"
        )
    return ENABLE, reasons
