"""Alembic environment for airflow-adrq's own database.

Run only through :mod:`airflow_adrq.migrate` (``airflow-adrq db ...``), which
configures Alembic in code and passes a connection already in a transaction.
"""

from __future__ import annotations

from alembic import context

from airflow_adrq import dialects, migrate
from airflow_adrq.models import metadata

if context.is_offline_mode():
    raise RuntimeError("airflow-adrq migrations run online only")
connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run airflow-adrq migrations with `airflow-adrq db ...` (airflow_adrq.migrate)")
context.configure(
    connection=connection,
    target_metadata=metadata,
    # Records each applied revision for `airflow-adrq db upgrade`'s report.
    on_version_apply=context.config.attributes.get(migrate.ON_VERSION_APPLY),
    # The caller's transaction covers the whole run: on PostgreSQL and
    # SQLite a failed upgrade leaves nothing behind.
    transaction_per_migration=False,
    **migrate.comparison_options(),
)
dialects.get(connection).check_before_ddl(connection)
with context.begin_transaction():
    context.run_migrations()
