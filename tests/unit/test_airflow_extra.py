"""The ``airflow`` extra and the plug-in's accepted release lines say the same thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_adrq.airflow import compat

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_airflow_extra_allows_exactly_the_releases_the_plugin_accepts():
    """From the oldest line's first accepted release (3.1.7: 3.1.0-3.1.6 are refused) to the newest line."""
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["airflow"]
    oldest = compat.ADAPTERS[min(compat.SUPPORTED)].minimum
    high = max(compat.SUPPORTED)
    assert extra == [f"apache-airflow-core>={'.'.join(map(str, oldest))},<{high[0]}.{high[1] + 1}"]


@pytest.mark.parametrize(
    ("version", "line"), [("3.3.2", (3, 3)), ("3.4.0b2", (3, 4)), ("3.10.1", (3, 10)), ("main", None)]
)
def test_release_line(version, line):
    assert compat.release_line(version) == line
