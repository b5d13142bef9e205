"""Alembic environment for airflow-adrq's own database.

Run only through :mod:`airflow_adrq.migrate` (``airflow-adrq db ...``), which
configures Alembic in code and passes a connection already in a transaction.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from airflow_adrq import migrate
from airflow_adrq.errors import AdrqError
from airflow_adrq.models import metadata


def run_migrations_online() -> None:
    """Run the revisions on the connection :mod:`airflow_adrq.migrate` passed in."""
    config = context.config
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run airflow-adrq migrations with `airflow-adrq db ...` (airflow_adrq.migrate)")
    # Records each applied revision for `airflow-adrq db upgrade`'s report.
    on_version_apply = config.attributes.get(migrate.ON_VERSION_APPLY)
    context.configure(
        connection=connection,
        target_metadata=metadata,
        on_version_apply=on_version_apply,
        # The caller's transaction covers the whole run: on PostgreSQL and
        # SQLite a failed upgrade leaves nothing behind.
        transaction_per_migration=False,
        **migrate.comparison_options(),
    )
    _require_explicit_timestamp_defaults(connection)
    with context.begin_transaction():
        context.run_migrations()


def _require_explicit_timestamp_defaults(connection: Connection) -> None:
    """Refuse MySQL/MariaDB with ``explicit_defaults_for_timestamp`` off, before any DDL.

    Off, the server gives the first ``TIMESTAMP NOT NULL`` column of a table
    ``DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP``, so
    ``asset_dag_run_queue.created_at`` would move on every UPDATE of its row
    (Airflow refuses such servers too). On by default since MySQL 8.0 and
    MariaDB 10.10.
    """
    if connection.dialect.name not in ("mysql", "mariadb"):
        return
    value = connection.exec_driver_sql("SELECT @@SESSION.explicit_defaults_for_timestamp").scalar()
    if not value:
        raise AdrqError(
            "airflow-adrq migrations need explicit_defaults_for_timestamp=ON on MySQL/MariaDB "
            "(set it in the server configuration); otherwise TIMESTAMP NOT NULL columns get an "
            "implicit DEFAULT/ON UPDATE CURRENT_TIMESTAMP. Nothing was changed."
        )


if context.is_offline_mode():
    raise RuntimeError("airflow-adrq migrations run online only")
run_migrations_online()
