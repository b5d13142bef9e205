"""``airflow-adrq doctor`` on databases made by ``airflow db migrate``, seeded through Airflow's models.

Runs in every tox -e airflowNN environment: the expected release line is the
installed Airflow's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow
import pytest
import sqlalchemy as sa
from airflow.models.asset import TaskOutletAssetReference
from sqlalchemy.orm import Session

from airflow_adrq import doctor
from airflow_adrq.airflow import compat
from airflow_adrq_testing.recording import recorded
from tests.plugin import adrq_af_scenario as scenario
from tests.support import exposure
from tests.support.exposure import exposure_fields

LINE = tuple(int(part) for part in airflow.__version__.split(".")[:2])
EVENT_KEYED = compat.SHAPES[LINE].event_keyed


def seed_exposed(engine):
    """tests/support/exposure.py's world, through Airflow's models."""
    with Session(engine) as session:
        seeded = scenario.seed(session, **exposure.SCENARIO)
        assets, aliases = seeded.asset_ids, seeded.alias_ids
        session.execute(
            sa.table("asset_alias_asset", sa.column("alias_id"), sa.column("asset_id")).insert(),
            [
                {"alias_id": aliases[alias], "asset_id": assets[asset]}
                for alias, asset in exposure.ALIAS_LINKS
            ],
        )
        session.add_all(
            TaskOutletAssetReference(asset_id=assets[a], dag_id=d, task_id=t) for a, d, t in exposure.OUTLETS
        )
        session.commit()


def expected_verdict(backend):
    if backend == "sqlite" or EVENT_KEYED:
        return doctor.NOT_NEEDED
    return doctor.ENABLE


def test_report_on_a_migrated_database(af_engine, airflow_db):
    seed_exposed(af_engine)
    report = doctor.check(airflow_db.url)

    c = report.compatibility
    assert c.schema.line == LINE and c.schema.complete, c.schema
    assert c.supported, c.support
    assert c.shape == compat.SHAPES[LINE].name
    assert set(c.queue_key) == set(compat.SHAPES[LINE].queue_key)
    assert c.dag_id_collations["dag.dag_id"]
    if airflow_db.backend == "mysql":
        # Airflow's own collation for ids on MySQL (models/base.py COLLATION_ARGS).
        assert set(c.dag_id_collations.values()) == {"utf8mb3_bin"}
        assert c.storage_engine == "InnoDB"
    if airflow_db.backend == "postgresql":
        assert c.pgbouncer.detected is False

    assert exposure_fields(report.exposure) == exposure.EXPOSURE

    assert report.verdict == expected_verdict(airflow_db.backend), report.reasons
    assert report.exit_code == doctor.EXIT_CODES[report.verdict]
    print(doctor.render_text(report))


def test_nothing_scheduled_on_assets_is_not_needed(af_engine, airflow_db):
    report = doctor.check(airflow_db.url)
    assert report.verdict == doctor.NOT_NEEDED
    assert report.exposure.assets_with_consumers == 0


def test_doctor_only_reads_an_airflow_database(af_engine, airflow_db):
    seed_exposed(af_engine)
    with recorded() as seen:
        doctor.check(airflow_db.url)
    writes = seen.writes()
    assert not writes, f"doctor sent statements that are not reads: {writes}"
    assert seen.commits == 0
    with doctor.read_only_connection(airflow_db.url) as conn, pytest.raises(sa.exc.DBAPIError):
        conn.exec_driver_sql("DELETE FROM dag")
    with af_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM dag").scalar() > 0


def _cli(env, *args):
    script = Path(sys.executable).with_name("airflow-adrq")
    # The installed command (tox); from a checkout's venv without it, the same module.
    command = [str(script)] if script.exists() else [sys.executable, "-m", "airflow_adrq.cli"]
    command += ["doctor", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_command_defaults_to_airflows_configured_database(af_engine, airflow_db, tmp_path):
    """No --url: Airflow's own configuration (airflow.cfg in AIRFLOW_HOME) names the database."""
    seed_exposed(af_engine)
    url = airflow_db.url.render_as_string(hide_password=False)
    (tmp_path / "airflow.cfg").write_text(f"[database]\nsql_alchemy_conn = {url}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env["AIRFLOW_HOME"] = str(tmp_path)
    result = _cli(env, "--json")
    data = json.loads(result.stdout)
    assert result.returncode == data["exit_code"] == doctor.EXIT_CODES[expected_verdict(airflow_db.backend)]
    assert data["url"] == airflow_db.url.render_as_string(hide_password=True)
    assert data["compatibility"]["schema"]["line"] == list(LINE)

    text = _cli(airflow_db.airflow_env(), "--url", url)
    assert text.returncode == result.returncode
    assert "Verdict:" in text.stdout and doctor.CONFIG_LINE in text.stdout
    assert len(text.stdout.splitlines()) <= 32, text.stdout
