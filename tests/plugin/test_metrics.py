"""The plug-in's metrics reach the deployment's StatsD, from a real Airflow process.

An Airflow process configured as an operator would (``[metrics] statsd_on``,
``[core] asset_manager_class``, ``asset_manager_kwargs`` with a tiny
``slow_write_ms``) registers one event through Airflow's own
``asset_manager`` and commits; a UDP socket in this process plays StatsD.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from sqlalchemy.orm import Session

from tests.plugin import adrq_af_scenario as scenario

pytest.importorskip("statsd", reason="Airflow's StatsD client needs the statsd package")

_PROBE = textwrap.dedent(
    """
    from airflow import settings
    from airflow.configuration import conf

    # Every component initializes its metrics backend at start, as the api-server does.
    try:  # 3.2+
        from airflow._shared.observability.metrics import stats
        from airflow.observability.metrics import stats_utils
    except ImportError:  # 3.1: airflow.stats.Stats configures itself
        pass
    else:
        if hasattr(stats, "initialize"):  # 3.3+: the module's initialize
            stats.initialize(
                factory=stats_utils.get_stats_factory(),
                export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
            )
        else:  # 3.2: the Stats class's, as its scheduler does
            stats.Stats.initialize(factory=stats_utils.get_stats_factory(stats.Stats))
    from types import SimpleNamespace

    from airflow.assets.manager import asset_manager

    session = settings.Session()
    # What the plug-in reads of an asset: its name and URI (every release line's key types have them).
    event = asset_manager.register_asset_change(asset=SimpleNamespace(name="a1", uri=URI), session=session)
    session.commit()
    print("EVENT", event.id, type(asset_manager).__name__)
    """
)


def _statsd() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    return sock


def _received(sock: socket.socket, seconds: float = 3.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            if any(line.startswith("airflow.adrq.queue_write.events") for line in lines):
                break
            continue
        lines += data.decode().splitlines()
    return lines


def test_queue_write_metrics_and_slow_warning_reach_statsd(airflow_db, af_engine):
    with Session(af_engine) as session:
        scenario.seed(session, assets=["a1"], consumers={"a1": ["c1", "c2"]})
        session.commit()
    sock = _statsd()
    env = {
        **os.environ,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db.url.render_as_string(hide_password=False),
        "AIRFLOW__CORE__ASSET_MANAGER_CLASS": "airflow_adrq.airflow.AdrqAssetManager",
        "AIRFLOW__CORE__ASSET_MANAGER_KWARGS": json.dumps({"slow_write_ms": 0.001}),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    probe = f"URI = {scenario.uri('a1')!r}\n{_PROBE}"
    run = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    try:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "AdrqAssetManager" in run.stdout
        lines = _received(sock)
    finally:
        sock.close()
    timing = [line for line in lines if line.startswith("airflow.adrq.queue_write:")]
    assert len(timing) == 1 and timing[0].endswith("|ms"), lines
    assert "airflow.adrq.queue_write.events:1|c" in lines, lines
    assert "airflow.adrq.queue_write.rows:2|c" in lines, lines  # c1 and c2
    assert "the queue write at COMMIT took" in run.stdout + run.stderr  # slow_write_ms = 0.001
