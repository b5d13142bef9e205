"""SQLite: the file opened ``mode=ro`` (a missing file is an error, never created) and ``PRAGMA query_only``.

One writer at a time: no two transactions hold queue-row locks together, so
the verdict is "not needed" whatever the exposure.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from airflow_adrq.doctor.backends import DAG_ID_COLUMNS, Probe, scalar
from airflow_adrq.doctor.report import DoctorError


def _read_only(url: URL) -> tuple[URL, dict[str, Any]]:
    database = url.database or ""
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        query = {"uri": "true", **url.query}
        if "mode=" not in database and "mode" not in query:
            query["mode"] = "ro"
        return url.set(query=query), {}
    if database in ("", ":memory:"):
        raise DoctorError("an in-memory SQLite database holds no Airflow schema: pass the database file")
    path = Path(database).expanduser().resolve()
    if not path.is_file():
        raise DoctorError(f"no SQLite database file at {path}")
    file = f"file:{urllib.parse.quote(str(path))}"
    return url.set(database=file, query={**url.query, "mode": "ro", "uri": "true"}), {}


PROBE = Probe(
    name="sqlite",
    engine_args=_read_only,
    begin_read_only=("PRAGMA query_only = ON", "BEGIN"),
    server=lambda conn: f"SQLite {scalar(conn, 'SELECT sqlite_version()')}",
    # SQLite's default collation, not read from the schema.
    collations=lambda conn: {f"{t}.{c}": "BINARY" for t, c in DAG_ID_COLUMNS},
    cannot_deadlock="SQLite runs one writer at a time: two transactions never hold queue-row locks "
    "together, so there is no deadlock to remove (and Airflow does not support SQLite in production)",
)
