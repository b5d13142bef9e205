"""``airflow-adrq doctor``: should this Airflow deployment enable the plug-in? A read-only check.

Reads an Airflow metadata database and reports, on one screen, its
compatibility (schema version, queue key, the plug-in's support, server,
isolation, collations, PgBouncer), its exposure (consumers per asset,
producers, multi-outlet tasks, aliases, deadlock counters) and a verdict
with its exit status (:data:`EXIT_CODES`; :data:`EXIT_NO_REPORT` for no
report). What each line means: the README's "Should I enable it?".

Read-only by construction, and tested so: one transaction, made read-only
before the first query (per backend: :mod:`.backends`) and rolled back at
the end; only ``SELECT``, ``SHOW`` and catalog reads, from one snapshot.
PgBouncer detection opens at most three more connections (:mod:`.pgbouncer`).

One job per module: :mod:`.report` (the dataclasses), :mod:`.connection`
(the read-only transaction), :mod:`.compatibility`, :mod:`.exposure`,
:mod:`.verdict`, :mod:`.checkup` (:func:`check`), :mod:`.render`,
:mod:`.cli`; what differs per backend is a :class:`.backends.Probe`, so no
other module compares backend names.
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
