"""What the runtime wheel holds: the product, and nothing that only the benchmark or the tests use.

``tox -e py`` installs the built wheel (``package = wheel``), so the installed
distribution's RECORD is the wheel's file list. An editable install (a
developer's venv) has no such list: the test then builds the wheel itself.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The runtime package's own parts (issue: the file list shows the design).
EXPECTED_PACKAGES = {
    "airflow_adrq",
    "airflow_adrq/airflow",
    "airflow_adrq/dialects",
    "airflow_adrq/doctor",
    "airflow_adrq/migrations",
    "airflow_adrq/migrations/versions",
}
# Module names that belong to the benchmark distribution or the test support.
FORBIDDEN = ("bench", "baseline", "servers", "strateg", "harness", "factories", "conftest", "test_")


def _wheel_files(tmp_path: Path) -> list[str]:
    files = importlib.metadata.files("airflow-adrq") or []
    installed = [str(f) for f in files if str(f).startswith("airflow_adrq/")]
    if "airflow_adrq/__init__.py" in installed:  # an editable install's RECORD lists only the extras
        return installed
    # Editable install: build the wheel as `pip wheel --no-deps .` would.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{done.stderr}")
    (wheel,) = tmp_path.glob("airflow_adrq-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return [name for name in archive.namelist() if name.startswith("airflow_adrq/")]


def test_runtime_wheel_holds_no_benchmark_baseline_or_test_server_module(tmp_path):
    files = _wheel_files(tmp_path)
    modules = [f for f in files if f.endswith(".py")]
    assert "airflow_adrq/queue.py" in modules and "airflow_adrq/py.typed" in files
    packages = {f.rsplit("/", 1)[0] for f in modules}
    assert packages == EXPECTED_PACKAGES
    offending = [m for m in modules if any(word in m.rsplit("/", 1)[1] for word in FORBIDDEN)]
    assert offending == []
    # The migrations ship inside the package (alembic's script location).
    assert any(f.startswith("airflow_adrq/migrations/versions/0001_") for f in modules)


def test_the_sdist_holds_what_tox_and_the_readme_need(tmp_path, monkeypatch):
    """The source distribution, built by the project's backend, can run ``tox`` and the README's links."""
    import tarfile

    from hatchling.build import build_sdist

    monkeypatch.chdir(ROOT)
    name = build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    needed = [
        "tox.ini",
        "testing/pyproject.toml",  # tox's commands_pre install ./testing and ./bench
        "bench/pyproject.toml",
        ".ci/run",
        "RELIABILITY.md",  # linked from the README
        "docs/operator-guide.md",
        "docs/sql/postgresql.sql",
        "GUARANTEES.md",
        "BENCHMARKS.md",
        "LICENSE",
        "migrations/env.py",
        "airflow_adrq/py.typed",
        "tests/conftest.py",
    ]
    assert [path for path in needed if path not in members] == []


def test_under_tox_the_suite_imports_the_installed_package_not_the_checkout():
    """``tox -e py`` tests the built wheel: the package must come from the venv's site-packages."""
    import os

    import airflow_adrq

    where = Path(airflow_adrq.__file__).resolve()
    if not os.environ.get("TOX_ENV_NAME"):
        pytest.skip(f"not under tox (airflow_adrq from {where})")
    assert Path(sys.prefix).resolve() in where.parents, f"tox imported {where}, not the installed wheel"
