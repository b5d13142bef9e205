"""airflow-adrq's test support, imported by its tests and by ``airflow-adrq bench``, never by airflow_adrq.

* :mod:`.servers`       -- finds or starts PostgreSQL and MySQL/MariaDB servers (and PgBouncer, Redis);
* :mod:`.recording`     -- what an engine sends: the statements, or how many per thread;
* :mod:`.pytest_plugin` -- the fixtures of every test suite (``backend``, ``db_url`` ...), a
  ``pytest11`` plug-in;
* :mod:`.dataset`       -- scratch databases, the seed data, the exact-rows check;
* :mod:`.baselines`     -- the loop versions airflow-adrq replaces, kept faithfully;
* :mod:`.strategies`    -- what "a transaction emits these assets" means for each of them and for ours;
* :mod:`.transactions`  -- one producer transaction, retried as a whole, and how it went;
* :mod:`.scheduler`     -- what Airflow 3.3.2's scheduler does to the queue;
* :mod:`.protocols`     -- the stamping protocols airflow-adrq used before its present one.
"""

__version__ = "0.1.0"
