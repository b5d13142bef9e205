"""``airflow-adrq doctor``: should this Airflow deployment enable the plug-in? A read-only check.

::

    airflow-adrq doctor [--url URL] [--json]

Reads an Airflow metadata database and reports, on one screen:

* **Compatibility** -- the Airflow schema version (``alembic_version``), the
  queue's primary key (:func:`airflow_adrq.shapes.detect`), whether the
  plug-in supports that release line (:mod:`airflow_adrq.airflow.compat`),
  the server, MySQL/MariaDB's isolation level, the collation of the DAG id
  columns, and whether the connection goes through PgBouncer.
* **Exposure** -- how many consumer DAGs each asset has (direct, name and URI
  references of unpaused DAGs), assets produced by several tasks, tasks with
  several outlets, alias use, and on PostgreSQL the database's deadlock
  counter and (with ``pg_stat_statements``) the queue inserts' calls and
  mean time.
* **Verdict** -- enable, not needed, or not supported, with the reason.

Exit status: **0** enable, **1** not needed, **2** not supported, **3** no
report (not an Airflow metadata database, or it could not be read). Usage
errors are argparse's 2.

Read-only by construction, and tested so (``tests/integration/test_doctor.py``):
one transaction, made read-only before the first query and rolled back at the
end -- PostgreSQL ``SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ
ONLY`` (transaction-scoped, so nothing leaks into a pooled server connection
behind PgBouncer), MySQL/MariaDB ``START TRANSACTION WITH CONSISTENT SNAPSHOT,
READ ONLY``, SQLite a file opened with ``mode=ro`` (a missing file is not
created) and ``PRAGMA query_only``. Every statement is a ``SELECT``, ``SHOW``
or a catalog read, all from one snapshot. PgBouncer detection opens at most
three more connections: to PgBouncer's admin console (``SHOW`` commands only)
and two that each run ``SELECT pg_backend_pid()``.

One job per module: :mod:`.report` (the dataclasses), :mod:`.connection`
(the read-only transaction), :mod:`.compatibility`, :mod:`.exposure`,
:mod:`.verdict`, :mod:`.checkup` (:func:`check`), :mod:`.render`,
:mod:`.cli`; what differs per backend is a :class:`.backends.Probe` in
:mod:`.backends` (PgBouncer: :mod:`.pgbouncer`), so no other module compares
backend names.
"""

from __future__ import annotations

from airflow_adrq.doctor.checkup import check
from airflow_adrq.doctor.cli import add_doctor_parser, airflow_schema, airflow_url
from airflow_adrq.doctor.compatibility import schema_version
from airflow_adrq.doctor.connection import read_only_connection
from airflow_adrq.doctor.render import CONFIG_LINE, CONFIG_SECTION, render_json, render_text
from airflow_adrq.doctor.report import (
    ENABLE,
    EXIT_CODES,
    EXIT_NO_REPORT,
    FANOUT_THRESHOLDS,
    NOT_NEEDED,
    NOT_SUPPORTED,
    Compatibility,
    DoctorError,
    Exposure,
    PgBouncer,
    QueueInsert,
    Report,
    SchemaVersion,
)

__all__ = [
    "CONFIG_LINE",
    "CONFIG_SECTION",
    "ENABLE",
    "EXIT_CODES",
    "EXIT_NO_REPORT",
    "FANOUT_THRESHOLDS",
    "NOT_NEEDED",
    "NOT_SUPPORTED",
    "Compatibility",
    "DoctorError",
    "Exposure",
    "PgBouncer",
    "QueueInsert",
    "Report",
    "SchemaVersion",
    "add_doctor_parser",
    "airflow_schema",
    "airflow_url",
    "check",
    "read_only_connection",
    "render_json",
    "render_text",
    "schema_version",
]
