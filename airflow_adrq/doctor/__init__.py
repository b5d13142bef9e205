"""``airflow-adrq doctor``: should this Airflow deployment enable the plug-in? A read-only check.

:func:`check` reads a metadata database's compatibility (:mod:`.compatibility`) and exposure
(:mod:`.exposure`) into a :mod:`.report` and decides: enable when a transaction can write two queue rows
that another locks in the other order; not needed when none writes two, the queue is keyed by event, or
the backend runs one writer at a time. Exit status: :data:`EXIT_CODES`, :data:`EXIT_NO_REPORT`. What
each line means: the README's "Should I enable it?".

Read-only by construction, and tested so: one transaction, read-only before the first query and rolled
back at the end; only ``SELECT``, ``SHOW`` and catalog reads, from one snapshot (:mod:`.backends`: each
backend's differences). PgBouncer detection opens at most three more connections.
"""

from __future__ import annotations

import argparse
import os
import sys

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.doctor import backends, compatibility, exposure
from airflow_adrq.doctor.backends import read_only_connection
from airflow_adrq.doctor.compatibility import schema_version
from airflow_adrq.doctor.report import (
    CONFIG_LINE,
    ENABLE,
    EXIT_CODES,
    EXIT_NO_REPORT,
    FANOUT_THRESHOLDS,
    NOT_NEEDED,
    NOT_SUPPORTED,
    Compatibility,
    DoctorError,
    Exposure,
    Report,
    SchemaVersion,
    count,
    first_line,
    render_json,
    render_text,
)

__all__ = [
    "CONFIG_LINE",
    "ENABLE",
    "EXIT_CODES",
    "EXIT_NO_REPORT",
    "NOT_NEEDED",
    "NOT_SUPPORTED",
    "DoctorError",
    "Report",
    "SchemaVersion",
    "add_doctor_parser",
    "check",
    "read_only_connection",
    "render_json",
    "render_text",
    "schema_version",
]


def check(url: str | URL, schema: str | None = None) -> Report:
    """Read the Airflow metadata database at ``url`` (read-only) and return the report.

    ``schema``: where Airflow's tables are, if not in the default schema
    (``[database] sql_alchemy_schema``; PostgreSQL). Raises :class:`DoctorError` when it is no Airflow
    metadata database or cannot be read.
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
    return Report(safe, compat, exposed, *_decide(compat, exposed, probe), warnings)


def _decide(compat: Compatibility, exposed: Exposure | None, probe: backends.Probe) -> tuple[str, list[str]]:
    """``(verdict, reasons)``; ``exposed`` is ``None`` only for a schema that is not supported."""
    if not compat.supported:
        return NOT_SUPPORTED, [compat.support]
    if probe.cannot_deadlock:
        return NOT_NEEDED, [probe.cannot_deadlock]
    assert exposed is not None  # check() refuses a supported schema without the exposure's tables
    if set(compat.queue_key or ()) == {"target_dag_id", "asset_event_id"}:
        reason = (
            "this queue is keyed by (target_dag_id, asset_event_id): concurrent producers insert different "
            "rows and cannot deadlock on them"
        )
        if exposed.fanout_max > FANOUT_THRESHOLDS[0]:
            reason += (
                "; the plug-in still saves loading every consumer DAG per event "
                f"(up to {exposed.fanout_max:,} here)"
            )
        return NOT_NEEDED, [reason]
    reasons = []
    if exposed.racing:
        reasons.append(
            f"{count(exposed.racing, 'asset')} with 2+ consumer DAGs produced by several tasks: two "
            "producers lock the same queue rows in Python set order, which differs between processes"
        )
    if exposed.multi_outlet_shared:
        reasons.append(
            f"{count(exposed.multi_outlet_shared, 'task')} with several outlets sharing a consumer DAG: "
            "two runs lock (A, dag) and (B, dag) in opposite orders"
        )
    if exposed.multi_consumer_assets and not exposed.racing:
        reasons.append(
            f"{count(exposed.multi_consumer_assets, 'asset')} with 2+ consumer DAGs (max "
            f"{exposed.fanout_max:,}): events for one of them racing each other (several runs, mapped "
            "tasks, the REST API) lock its queue rows in different orders"
        )
    if exposed.multi_outlet_multirow and not reasons:
        reasons.append(
            f"{count(exposed.multi_outlet_multirow, 'task')} with several outlets queueing 2+ rows per "
            "success: two runs lock them in different orders"
        )
    if exposed.alias_multirow:
        reasons.append(f"{count(exposed.alias_multirow, 'alias', 'aliases')} queueing 2+ rows per event")
    if not reasons:
        if not exposed.assets_with_consumers and not exposed.alias_references:
            return NOT_NEEDED, ["no unpaused DAG is scheduled on an asset: nothing is queued"]
        return NOT_NEEDED, [
            "no transaction can write two queue rows: every asset has at most one consumer DAG, no task's "
            "outlets reach two, and no alias event queues two"
        ]
    if exposed.deadlocks and probe.deadlock_counter:
        reasons.append(
            f"{probe.deadlock_counter} has counted {count(exposed.deadlocks, 'deadlock')} "
            f"({exposed.deadlocks_scope})"
        )
    return ENABLE, reasons


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor [--url URL] [--schema SCHEMA] [--json]``."""
    parser = subparsers.add_parser(
        "doctor",
        allow_abbrev=False,
        help="read-only check: should this Airflow deployment enable the plug-in?",
        description="Reads an Airflow metadata database in one read-only transaction and reports "
        "compatibility, exposure to the asset_dag_run_queue deadlock, and a verdict. Exit status: "
        "0 enable, 1 not needed, 3 not supported, 4 no report (not an Airflow database, unreadable); "
        "2 a usage error (a bad option or URL).",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help="SQLAlchemy URL of Airflow's metadata database (default: Airflow's [database] "
        "sql_alchemy_conn, when Airflow is importable here)",
    )
    parser.add_argument(
        "--schema",
        help="PostgreSQL schema of Airflow's tables (default: Airflow's [database] sql_alchemy_schema, "
        "from AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA or Airflow's configuration when importable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_run, command_parser=parser)


def _run(args: argparse.Namespace) -> int:
    try:
        url = args.url or _airflow_setting("sql_alchemy_conn")
        if not url:
            raise DoctorError(
                "no --url, and Airflow is not importable here to read [database] sql_alchemy_conn: "
                "pass --url with Airflow's metadata database URL"
            )
        schema = args.schema if args.schema is not None else _airflow_setting("sql_alchemy_schema")
        report = check(url, schema)
    except DoctorError as exc:
        print(f"airflow-adrq doctor: {exc}", file=sys.stderr)
        return EXIT_NO_REPORT
    print(render_json(report) if args.json else render_text(report))
    return report.exit_code


def database_url(text: str) -> str:
    """An argparse ``type=``: ``text`` if SQLAlchemy can parse it as a URL (a usage error, exit 2, if not)."""
    try:
        sa.make_url(text)
    except sa.exc.ArgumentError:
        raise argparse.ArgumentTypeError(
            f"not a SQLAlchemy database URL: {text!r} (e.g. postgresql://user@host:5432/airflow)"
        ) from None
    return text


def _airflow_setting(option: str) -> str | None:
    """Airflow's ``[database] <option>``: its environment variable, else Airflow's configuration.

    ``None`` when empty, or when Airflow is not importable: ``--url`` needs no Airflow.
    """
    value = os.environ.get(f"AIRFLOW__DATABASE__{option.upper()}")
    if value is None:
        try:
            from airflow.configuration import conf
        except ModuleNotFoundError:
            return None
        value = str(conf.get("database", option, fallback=""))
    return value.strip() or None
