"""The benchmark's own tests: ``pytest bench/tests`` (``tox -e py`` runs them after ``tests``).

The fixtures (``backend``, ``db_url``, ``server_info`` ...) are the test support's pytest
plug-in, :mod:`airflow_adrq_testing.pytest_plugin`, loaded through its ``pytest11`` entry point,
the same as for ``tests/``. No ``__init__.py`` here: the modules are imported by their names,
which must not repeat one under ``tests/``.

``airflow/`` holds the tests of ``bench --airflow`` and ``--live``, which need Apache Airflow:
without it installed they are not collected (the ``airflowNN`` tox environments run them).
"""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("airflow") is not None else ["airflow"]
