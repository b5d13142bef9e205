"""What ``asset_manager_class = airflow_adrq.airflow.AdrqAssetManager`` loads into every Airflow process.

The plug-in path alone: the statement, the commit-time bookkeeping (not the
alias rows: the plug-in writes Airflow's itself), dialects, shapes, compat,
the tables (Core ``Table`` objects of the columns it uses, not the models),
errors. Not the standalone manager,
the whole-transaction retry, the listeners registry, the engine factory, the
migrations or doctor; not the opt-in triggerer patch, nor the after-COMMIT
refresh (with its error classification), which load where they are used
(MariaDB's default, ``use_row_level_locking = False``); and no ``Session``
listener until a transaction first defers an event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow_adrq

#: The modules of airflow_adrq the plug-in runs (the dialect backends load at the first statement).
PLUGIN_PATH = [
    "airflow_adrq",
    "airflow_adrq.airflow",
    "airflow_adrq.airflow.compat",
    "airflow_adrq.airflow.manager",
    "airflow_adrq.deferral",
    "airflow_adrq.dialects",
    "airflow_adrq.errors",
    "airflow_adrq.metrics",
    "airflow_adrq.queue",
    "airflow_adrq.shapes",
    "airflow_adrq.statement",
    "airflow_adrq.tables",
    "airflow_adrq.txscope",
]

_PROBE = """
import json, sys
from sqlalchemy.orm import Session
import airflow.assets.manager  # Airflow's own listeners, if any, come before the count
before = len(Session().dispatch.before_commit)
import airflow_adrq.airflow
from airflow_adrq.airflow import AdrqAssetManager
print("ADRQ-PROBE", json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("airflow_adrq")),
    "before_commit_listeners_added": len(Session().dispatch.before_commit) - before,
}))
"""


def test_the_plugin_import_loads_the_plugin_path_only(tmp_path):
    # The package this test process imported (the wheel under tox, a checkout otherwise).
    env = {**os.environ, "PYTHONPATH": str(Path(airflow_adrq.__file__).resolve().parents[1])}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    # Airflow may log to stdout while it initialises: the probe's line is marked.
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("ADRQ-PROBE ")]
    found = json.loads(line.removeprefix("ADRQ-PROBE "))
    assert found["modules"] == PLUGIN_PATH
    assert found["before_commit_listeners_added"] == 0
