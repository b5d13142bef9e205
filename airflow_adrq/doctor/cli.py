"""``airflow-adrq doctor [--url URL] [--schema SCHEMA] [--json]``: the parser, the URL, the exit status."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from airflow_adrq.doctor.checkup import check
from airflow_adrq.doctor.render import render_json, render_text
from airflow_adrq.doctor.report import EXIT_NO_REPORT, DoctorError

__all__ = ["add_doctor_parser", "airflow_schema", "airflow_url"]


def airflow_url() -> str:
    """Airflow's ``[database] sql_alchemy_conn``: from the environment, else from Airflow's configuration.

    Raises :class:`DoctorError` when Airflow is not importable here.
    """
    from_env = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").strip()
    if from_env:
        return from_env
    try:
        from airflow.configuration import conf
    except ImportError as exc:
        raise DoctorError(
            "no --url, and Airflow is not importable here to read [database] sql_alchemy_conn: "
            "pass --url with Airflow's metadata database URL"
        ) from exc
    return str(conf.get("database", "sql_alchemy_conn"))


def airflow_schema() -> str | None:
    """Airflow's ``[database] sql_alchemy_schema``: from the environment, else Airflow's configuration.

    ``None`` (the default schema) where Airflow is not installed: ``--url`` needs no Airflow.
    """
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA" in os.environ:
        return os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA"].strip() or None
    # find_spec of a submodule raises, not returns None, when its package is missing.
    if (
        importlib.util.find_spec("airflow") is None
        or importlib.util.find_spec("airflow.configuration") is None
    ):
        return None
    from airflow.configuration import conf

    return str(conf.get("database", "sql_alchemy_schema", fallback="")).strip() or None


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor``."""
    parser = subparsers.add_parser(
        "doctor",
        help="read-only check: should this Airflow deployment enable the plug-in?",
        description="Reads an Airflow metadata database in one read-only transaction and reports "
        "compatibility, exposure to the asset_dag_run_queue deadlock, and a verdict. Exit status: "
        "0 enable, 1 not needed, 2 not supported, 3 no report (not an Airflow database, unreadable).",
    )
    parser.add_argument(
        "--url",
        help="SQLAlchemy URL of Airflow's metadata database (default: Airflow's [database] "
        "sql_alchemy_conn, when Airflow is importable here)",
    )
    parser.add_argument(
        "--schema",
        help="PostgreSQL schema of Airflow's tables (default: Airflow's [database] sql_alchemy_schema, "
        "from AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA or Airflow's configuration when importable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        url = args.url or airflow_url()
        report = check(url, args.schema if args.schema is not None else airflow_schema())
    except DoctorError as exc:
        print(f"airflow-adrq doctor: {exc}", file=sys.stderr)
        return EXIT_NO_REPORT
    print(render_json(report) if args.json else render_text(report))
    return report.exit_code
