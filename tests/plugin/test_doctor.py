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
from tests.plugin import adrq_af_scenario as scenario
from tests.support.recording import recorded

LINE = tuple(int(part) for part in airflow.__version__.split(".")[:2])
EVENT_KEYED = compat.SHAPES[LINE].event_keyed


def seed_exposed(engine):
    """``a``: 3 consumers (2 direct, 1 by name; ``off`` is paused); racing and multi-outlet producers."""
    with Session(engine) as session:
        seeded = scenario.seed(
            session,
            assets=["a", "b", "e", "lonely"],
            consumers={"a": ["c1", "c2", "off"], "b": ["c4"], "e": ["c1"]},
            name_ref_consumers={"a": ["c3"]},
            alias_consumers={"x": ["c1", "c2"]},
            paused={"off"},
        )
        ids = seeded.asset_ids
        session.add_all(
            [
                # a: produced by tasks of two DAGs -> races (3 consumers).
                TaskOutletAssetReference(asset_id=ids["a"], dag_id="producer", task_id="t1"),
                TaskOutletAssetReference(asset_id=ids["a"], dag_id="c4", task_id="t9"),
                # producer.t1: outlets a, b -> 4 queue rows per success.
                TaskOutletAssetReference(asset_id=ids["b"], dag_id="producer", task_id="t1"),
                # producer.t2: outlets a, e -> c1 under both.
                TaskOutletAssetReference(asset_id=ids["a"], dag_id="producer", task_id="t2"),
                TaskOutletAssetReference(asset_id=ids["e"], dag_id="producer", task_id="t2"),
            ]
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

    e = report.exposure
    assert (e.assets, e.assets_with_consumers) == (4, 3)
    assert (e.fanout_max, e.fanout_p50, e.fanout_p99) == (3, 1, 3)
    assert (e.several_producers, e.several_producer_dags, e.racing) == (1, 1, 1)
    assert (e.multi_outlet_tasks, e.multi_outlet_multirow, e.multi_outlet_shared) == (2, 2, 1)
    assert (e.aliases, e.alias_references, e.alias_multirow) == (1, 2, 1)

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
