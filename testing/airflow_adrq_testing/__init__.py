"""airflow-adrq's test support, imported by its tests and by ``airflow-adrq bench``, never by airflow_adrq.

* :mod:`.servers`   -- finds or starts PostgreSQL and MySQL/MariaDB servers (and PgBouncer, Redis);
* :mod:`.recording` -- what an engine sends: the statements, or how many per thread.
"""

__version__ = "0.1.0"
