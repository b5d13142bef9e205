"""The suite's own additions to the ``airflow_adrq_testing`` pytest plug-in (its fixtures: ``backend``,
``db_url``, ``engine``, ``committed``, ``fresh_db_url``, ``server_info``, ``pgbouncer_db_url``; see
:mod:`airflow_adrq_testing.pytest_plugin`, loaded through its ``pytest11`` entry point).

* ``fan`` -- ``fan({"a": ["c1", "c2"]}, paused=...)``: assets by name, each
  scheduled directly by its DAGs (``tests.factories.add_scheduled_assets``),
  committed; returns name -> asset id.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

# Test modules import shared helpers as ``tests.<module>``. Append the
# repository root, never prepend it: under tox ``airflow_adrq`` must still
# resolve to the installed wheel, not to the source tree.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)

from tests.factories import add_scheduled_assets  # noqa: E402

# tests/plugin drives a real Apache Airflow: without one installed (the py
# env, a developer's venv) a plain `pytest` leaves it out and the header says
# so; tox -e airflow31 ... airflow34 run it.
# Asked of the distributions, not of `import airflow`: bench/tests/airflow, on sys.path when
# bench/tests runs too, would pass for a namespace package of that name.
try:
    _AIRFLOW_INSTALLED = bool(importlib.metadata.version("apache-airflow-core"))
except importlib.metadata.PackageNotFoundError:
    _AIRFLOW_INSTALLED = False
collect_ignore = [] if _AIRFLOW_INSTALLED else ["plugin"]


def pytest_report_header(config):
    if not _AIRFLOW_INSTALLED:
        return ["adrq plug-in tests (tests/plugin): not collected, Apache Airflow is not installed"]
    return []


@pytest.fixture
def fan(committed):
    """``fan(assets, **kw)``: :func:`tests.factories.add_scheduled_assets`, committed; name -> asset id."""
    return lambda assets, **kw: committed(lambda session: add_scheduled_assets(session, assets, **kw))
