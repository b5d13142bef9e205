"""MySQL/MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY``; isolation, engine, deadlocks.

The plug-in refuses to write above READ COMMITTED, which Airflow sets only
for URLs starting with ``mysql``: the server's default and the URL's scheme
are both reported. ``Innodb_deadlocks`` counts the whole server's, so the
verdict does not cite it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_adrq.doctor.backends import Probe, information_schema_collations, scalar
from airflow_adrq.doctor.report import Compatibility, Exposure


def _server(conn: Connection) -> str:
    raw = str(scalar(conn, "SELECT VERSION()"))
    return f"{'MariaDB' if 'mariadb' in raw.lower() else 'MySQL'} {raw}"


def _compatibility(conn: Connection, compatibility: Compatibility) -> list[str]:
    variables: dict[str, str] = dict(
        conn.execute(
            sa.text("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('transaction_isolation', 'tx_isolation')")
        ).all()
    )
    level = str(variables.get("transaction_isolation") or variables.get("tx_isolation") or "unknown")
    warnings = []
    drivername = conn.engine.url.drivername
    if drivername.startswith("mysql"):
        compatibility.isolation = f"server default {level}; Airflow's mysql connections use READ COMMITTED"
    else:
        compatibility.isolation = f"server default {level}"
        if level.replace("-", " ").upper() not in ("READ COMMITTED", "READ UNCOMMITTED"):
            warnings.append(
                "Airflow sets READ COMMITTED only for URLs starting with mysql: with "
                f"{drivername}:// its connections run at the server's {level}, where the plug-in "
                "refuses to write (IsolationLevelError). Use mysql+mysqldb:// or set "
                "transaction_isolation=READ-COMMITTED"
            )
    compatibility.storage_engine = scalar(
        conn,
        "SELECT engine FROM information_schema.tables WHERE table_schema = DATABASE() "
        "AND table_name = 'asset_dag_run_queue'",
    )
    if "mariadb" in compatibility.server.lower():
        warnings.append("Airflow does not support MariaDB (airflow-adrq's tests run on it)")
    return warnings


def _stats(conn: Connection, exposure: Exposure) -> list[str]:
    row = conn.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).first()
    if row is not None:
        exposure.deadlocks = int(row[1])
        exposure.deadlocks_scope = "Innodb_deadlocks: the whole server, any table, since it started"
    return []


PROBE = Probe(
    name="mysql",
    # No transaction is open yet: SET TRANSACTION applies to the one START TRANSACTION opens.
    begin_read_only=(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
    ),
    server=_server,
    collations=lambda conn: information_schema_collations(conn, "DATABASE()", None),
    compatibility=_compatibility,
    stats=_stats,
)
