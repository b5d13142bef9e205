"""``airflow-adrq doctor``: should this Airflow deployment enable the plug-in? A read-only check.

Reads an Airflow metadata database and reports, on one screen, its
compatibility (schema version, queue key, the plug-in's support, server,
isolation, collations, PgBouncer), its exposure (consumers per asset,
producers, multi-outlet tasks, aliases, deadlock counters) and a verdict
with its exit status (:data:`EXIT_CODES`; :data:`EXIT_NO_REPORT` for no
report). What each line means: the README's "Should I enable it?".

Read-only by construction, and tested so: one transaction, made read-only
before the first query and rolled back at the end (:mod:`.backends`); only
``SELECT``, ``SHOW`` and catalog reads, from one snapshot. PgBouncer
detection opens at most three more connections (:mod:`.pgbouncer`).
:func:`check` (:mod:`.checkup`) reads :mod:`.compatibility` and
:mod:`.exposure` into a :mod:`.report`, then decides; :mod:`.render` prints
it. What differs per backend is a :class:`.backends.Probe`: no other module
compares backend names.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import sqlalchemy as sa

from airflow_adrq.doctor.airflow_revisions import schema_version
from airflow_adrq.doctor.backends import read_only_connection
from airflow_adrq.doctor.checkup import check
from airflow_adrq.doctor.render import CONFIG_LINE, render_json, render_text
from airflow_adrq.doctor.report import (
    ENABLE,
    EXIT_CODES,
    EXIT_NO_REPORT,
    NOT_NEEDED,
    NOT_SUPPORTED,
    DoctorError,
    Report,
    SchemaVersion,
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
        report = check(
            url, args.schema if args.schema is not None else _airflow_setting("sql_alchemy_schema")
        )
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
    variable = f"AIRFLOW__DATABASE__{option.upper()}"
    if variable in os.environ:
        return os.environ[variable].strip() or None
    # find_spec of a submodule raises, not returns None, when its package is missing.
    if (
        importlib.util.find_spec("airflow") is None
        or importlib.util.find_spec("airflow.configuration") is None
    ):
        return None
    from airflow.configuration import conf

    return str(conf.get("database", option, fallback="")).strip() or None
