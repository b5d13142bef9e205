"""Airflow 3.0 is refused (tox -e airflow30): apache-airflow-core 3.0 requires SQLAlchemy < 2.0.

airflow-adrq is built on SQLAlchemy 2 (``SQLAlchemy>=2.0.36``), so the two
cannot share an environment: pip refuses to resolve them together, with or
without the ``airflow`` extra (whose range starts at 3.1). Forced in anyway
(``pip install --no-deps``, as this env does), ``pip check`` reports the
conflict and the plug-in does not import (``import airflow_adrq`` names
SQLAlchemy 2 and Airflow 3.1 as what it needs).

Runs with ``--noconftest`` and without importing airflow_adrq in this process:
the suite's conftest files and the package need SQLAlchemy 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd="/"
    )


def test_this_env_is_airflow_30_on_sqlalchemy_14():
    import airflow
    import sqlalchemy

    assert airflow.__version__.startswith("3.0.")
    assert sqlalchemy.__version__.startswith("1.4.")


def test_pip_check_reports_the_conflict():
    result = _run(sys.executable, "-m", "pip", "check")
    assert result.returncode != 0
    assert "airflow-adrq 0.1.0 has requirement sqlalchemy" in result.stdout.lower(), result.stdout


@pytest.mark.parametrize("target", ["[airflow]", ""], ids=["with-extra", "without-extra"])
def test_pip_refuses_to_install_them_together(target):
    import airflow

    result = _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        f"{ROOT}{target}",
        f"apache-airflow-core=={airflow.__version__}",
    )
    assert result.returncode != 0, result.stdout[-2000:]
    refused = "ResolutionImpossible" in result.stderr or "conflict" in result.stderr.lower()
    assert refused, result.stderr[-3000:]


def test_the_plugin_does_not_import_and_says_why():
    result = _run(sys.executable, "-c", "import airflow_adrq.airflow.manager")
    assert result.returncode != 0
    assert "ImportError: airflow-adrq needs SQLAlchemy 2.0 or later, found 1.4." in result.stderr, (
        result.stderr[-2000:]
    )
    assert "the Airflow plug-in supports Airflow 3.1 and later" in result.stderr
