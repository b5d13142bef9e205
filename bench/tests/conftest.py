"""The benchmark's own tests: ``pytest bench/tests`` (``tox -e py`` runs them after ``tests``).

The fixtures (``backend``, ``db_url``, ``server_info`` ...) are the test support's pytest
plug-in, :mod:`airflow_adrq_testing.pytest_plugin`, loaded through its ``pytest11`` entry point,
the same as for ``tests/``. No ``__init__.py`` here: the modules are imported by their names,
which must not repeat one under ``tests/``.

``airflow/`` holds the tests of ``bench --airflow``, which need Apache Airflow: without it
installed they are not collected (the ``airflowNN`` tox environments run them). Whether it is
installed is asked of the distributions, not of ``import airflow``: with this directory on
``sys.path``, ``airflow/`` here would pass for a namespace package of that name.
"""

from __future__ import annotations

import importlib.metadata


def _airflow_installed() -> bool:
    try:
        importlib.metadata.version("apache-airflow-core")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


collect_ignore = [] if _airflow_installed() else ["airflow"]
