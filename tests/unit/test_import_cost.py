"""What importing the package costs a process: modules loaded, listeners installed.

Every Airflow component imports what ``[core] asset_manager_class`` names;
the plug-in's own import set is checked in tests/plugin/test_plugin_imports.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_adrq

_PROBE = """
import json, sys
from sqlalchemy.orm import Session
EVENTS = ("before_commit", "after_commit", "after_soft_rollback", "after_transaction_end")
def listeners():
    session = Session()
    return [len(getattr(session.dispatch, name)) for name in EVENTS]
before = listeners()
import airflow_adrq
after = listeners()
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("airflow_adrq")),
    "tenacity": "tenacity" in sys.modules,
    "alembic": "alembic" in sys.modules,
    "session_listeners_added": [b - a for a, b in zip(before, after)],
}))
"""


def _probe(tmp_path):
    # The package this test process imported (the wheel under tox, a checkout otherwise).
    env = {**os.environ, "PYTHONPATH": str(Path(airflow_adrq.__file__).resolve().parents[1])}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_importing_the_package_loads_its_errors_only_and_installs_nothing(tmp_path):
    found = _probe(tmp_path)
    assert found == {
        "modules": ["airflow_adrq", "airflow_adrq.errors"],
        "tenacity": False,
        "alembic": False,
        "session_listeners_added": [0, 0, 0, 0],
    }


def test_the_public_names_resolve_each_from_its_own_module():
    import importlib

    import airflow_adrq

    lazy = airflow_adrq._LAZY
    # Every lazily loaded name is public, and every public name is lazy, an exception or the version.
    assert set(lazy) <= set(airflow_adrq.__all__)
    for name in airflow_adrq.__all__:
        value = getattr(airflow_adrq, name)
        if name in lazy:
            assert value is getattr(importlib.import_module(lazy[name]), name), name
        elif name != "__version__":
            assert issubclass(value, airflow_adrq.AdrqError), name
    with pytest.raises(AttributeError, match="no attribute 'queue_event'"):
        _ = airflow_adrq.queue_event
