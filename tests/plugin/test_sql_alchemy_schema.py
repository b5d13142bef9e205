"""``[database] sql_alchemy_schema``: Airflow's metadata in a PostgreSQL schema other than ``public``.

A scratch PostgreSQL database gets a schema ``airflow_meta`` and is migrated
by ``airflow db migrate`` with ``AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA=airflow_meta``
(a subprocess: Airflow reads its configuration at import). Airflow then
creates its tables in ``airflow_meta``; only Alembic's ``alembic_version``
lands in the connection's default schema (``public``), as Airflow's
migration environment leaves it there. No other Airflow table is in
``public``, so a statement naming ``asset_dag_run_queue`` unqualified fails
there (checked).

Asset events are registered through Airflow's own code in a subprocess with
the same settings (``TaskInstance.register_asset_changes_in_db`` for a task's
outlets, ``asset_manager.register_asset_change(source_is_api=True)`` for a
REST-style event), with ``[core] asset_manager_class`` set to the plug-in, or
left at Airflow's ``AssetManager`` for the control. The rows are then read
back from ``airflow_meta`` by schema-qualified SQL.

``airflow-adrq doctor`` is run against the same database with the schema
given the way Airflow is given it: ``AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA``
in the environment (with ``--url``), or ``airflow.cfg`` (no ``--url``); or
by its own ``--schema`` option. It must report this line, supported, with
the seeded exposure and its verdict (no error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_adrq import doctor
from tests.plugin import adrq_af_scenario as scenario
from tests.plugin.adrq_af_scenario import LINE

pytestmark = pytest.mark.airflow_backends("postgresql")

SCHEMA = "airflow_meta"
PLUGIN = "airflow_adrq.airflow.AdrqAssetManager"
STOCK = "airflow.assets.manager.AssetManager"
HERE = Path(__file__).resolve().parent

#: a1: c1, c2 (``off`` is paused); a2: c2, c3 directly, c4 by name; a3: c1.
SEED = dict(
    assets=["a1", "a2", "a3"],
    consumers={"a1": ["c1", "c2", "off"], "a2": ["c2", "c3"], "a3": ["c1"]},
    name_ref_consumers={"a2": ["c4"]},
    paused=["off"],  # a list: SEED is passed to the subprocess as JSON
)
#: What the registrations below queue: a1 and a2 from one task, a3 from the REST-style call.
QUEUED = [("a1", "c1"), ("a1", "c2"), ("a2", "c2"), ("a2", "c3"), ("a2", "c4"), ("a3", "c1")]

REGISTER = textwrap.dedent(
    """
    import json
    import sys
    from types import SimpleNamespace

    from tests.plugin import adrq_af_scenario as scenario
    from tests.plugin.adrq_af_scenario import outlet, task_instance
    from airflow.assets.manager import asset_manager
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    seed, register = json.loads(sys.argv[1]), sys.argv[2] == "register"
    with create_session() as session:
        seeded = scenario.seed(session, **seed)
    if register:
        # One task, two outlets: one transaction (committed when create_session exits).
        with create_session() as session:
            TaskInstance.register_asset_changes_in_db(
                task_instance("t"), [outlet("a1"), outlet("a2")], [], session=session
            )
        # A REST-style event (the plug-in stamps and queues it at once).
        with create_session() as session:
            asset_manager.register_asset_change(
                asset=SimpleNamespace(name="a3", uri=scenario.uri("a3")),
                extra={"api": True},
                source_is_api=True,
                session=session,
            )
    manager = type(asset_manager).__module__ + "." + type(asset_manager).__qualname__
    print("ADRQ-RESULT " + json.dumps({"asset_ids": seeded.asset_ids, "manager": manager}), flush=True)
    """
)


class SchemaDatabase:
    def __init__(self, url: sa.engine.URL):
        self.url = url
        self.engine = sa.create_engine(url)

    def airflow_env(self, **extra) -> dict[str, str]:
        env = dict(os.environ)
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.url.render_as_string(hide_password=False)
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA"] = SCHEMA
        env.pop("AIRFLOW__CORE__ASSET_MANAGER_CLASS", None)
        env.update(extra)
        return env

    def tables(self, schema: str) -> set[str]:
        with self.engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names(schema=schema))

    def empty(self) -> None:
        """Delete the scenario tables' rows in ``airflow_meta`` (children first)."""
        existing = self.tables(SCHEMA)
        with self.engine.begin() as conn:
            for name in scenario.SCENARIO_TABLES:
                if name in existing:
                    conn.execute(sa.table(name, schema=SCHEMA).delete())


def _airflow(env, *args) -> subprocess.CompletedProcess:
    airflow = Path(sys.executable).with_name("airflow")
    return subprocess.run(
        [str(airflow), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def schema_db(af_server):
    """A scratch PostgreSQL database whose Airflow metadata ``airflow db migrate`` put in ``airflow_meta``."""
    from airflow_adrq_testing import servers

    name = f"adrq_af_schema_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    db = SchemaDatabase(sa.engine.make_url(servers.create_database(af_server, name)))
    try:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {SCHEMA}")
        result = _airflow(db.airflow_env(), "db", "migrate")
        assert result.returncode == 0, (
            f"airflow db migrate with [database] sql_alchemy_schema={SCHEMA} failed:\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
        yield db
    finally:
        db.engine.dispose()
        servers.drop_database(af_server, name)


@pytest.fixture
def meta(schema_db):
    yield schema_db
    schema_db.empty()


def _register(db: SchemaDatabase, manager_class: str, *, register: bool = True) -> dict:
    env = db.airflow_env(AIRFLOW__CORE__ASSET_MANAGER_CLASS=manager_class)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1]), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", REGISTER, json.dumps(SEED), "register" if register else "seed"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = [
        line.removeprefix("ADRQ-RESULT ")
        for line in result.stdout.splitlines()
        if line.startswith("ADRQ-RESULT ")
    ]
    assert result.returncode == 0 and results, (
        f"registering through Airflow ({manager_class}, [database] sql_alchemy_schema={SCHEMA}) failed "
        f"(exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    out = json.loads(results[-1])
    assert out["manager"].rsplit(".", 1)[-1] == manager_class.rsplit(".", 1)[-1], out
    return out


def _stored(db: SchemaDatabase):
    """Events and queue rows, read from ``airflow_meta`` by schema-qualified SQL."""
    with db.engine.connect() as conn:
        events = conn.execute(
            sa.text(
                f"SELECT a.name, e.id, e.timestamp FROM {SCHEMA}.asset_event e "
                f"JOIN {SCHEMA}.asset a ON a.id = e.asset_id ORDER BY a.name"
            )
        ).all()
        rows = conn.execute(
            sa.text(
                f"SELECT asset_id, target_dag_id, created_at FROM {SCHEMA}.asset_dag_run_queue "
                "ORDER BY asset_id, target_dag_id"
            )
        ).all()
    return events, rows


def test_airflow_put_its_tables_in_the_schema(schema_db):
    in_schema = schema_db.tables(SCHEMA)
    assert {"asset", "asset_event", "asset_dag_run_queue", "dag", "dag_schedule_asset_reference"} <= in_schema
    # Airflow's Alembic environment keeps alembic_version in the default schema; nothing else is there.
    assert schema_db.tables("public") <= {"alembic_version"}
    # So an unqualified name of the queue table fails on this database.
    with schema_db.engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError, match="does not exist"):
        conn.exec_driver_sql("SELECT count(*) FROM asset_dag_run_queue")


def _expected_pairs(asset_ids):
    return sorted((asset_ids[name], dag_id) for name, dag_id in QUEUED)


def test_control_stock_airflow_queues_in_the_schema(meta):
    """The setup is right: stock Airflow registers and queues in ``airflow_meta``."""
    out = _register(meta, STOCK)
    events, rows = _stored(meta)
    assert [e.name for e in events] == ["a1", "a2", "a3"]
    assert sorted((r.asset_id, r.target_dag_id) for r in rows) == _expected_pairs(out["asset_ids"])
    stamp = {out["asset_ids"][e.name]: e.timestamp for e in events}
    assert all(r.created_at >= stamp[r.asset_id] for r in rows)


def test_plugin_queues_in_the_schema(meta):
    out = _register(meta, PLUGIN)
    events, rows = _stored(meta)
    ids = out["asset_ids"]
    assert [e.name for e in events] == ["a1", "a2", "a3"]
    assert sorted((r.asset_id, r.target_dag_id) for r in rows) == _expected_pairs(ids)

    stamp = {ids[e.name]: e.timestamp for e in events}
    # One transaction (the task's two outlets): one stamp for both events and all their rows.
    assert stamp[ids["a1"]] == stamp[ids["a2"]]
    # The REST-style event: stamped when it was queued, after the first transaction.
    assert stamp[ids["a3"]] > stamp[ids["a1"]]
    assert {(r.asset_id, r.target_dag_id): r.created_at for r in rows} == {
        (ids[name], dag_id): stamp[ids[name]] for name, dag_id in QUEUED
    }


def _doctor(env, *args) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("airflow-adrq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "airflow_adrq.cli"]
    return subprocess.run(
        [*command, "doctor", *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _expected_verdict():
    # PostgreSQL: an asset with 2+ consumer DAGs; Airflow 3.4's per-event queue needs no plug-in.
    return doctor.NOT_NEEDED if LINE.shape.event_keyed else doctor.ENABLE


def _assert_report(result):
    assert "airflow-adrq doctor:" not in result.stderr, result.stderr
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON report (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr}")
    c = data["compatibility"]
    assert c["schema"]["line"] == list(LINE.line) and c["schema"]["complete"], c["schema"]
    assert c["supported"], c["support"]
    assert c["shape"] == LINE.shape.name
    assert set(c["queue_key"]) == set(LINE.shape.queue_key)
    e = data["exposure"]
    assert (e["assets"], e["assets_with_consumers"], e["fanout_max"]) == (3, 3, 3), e
    assert data["verdict"] == _expected_verdict(), data["reasons"]
    assert result.returncode == data["exit_code"] == doctor.EXIT_CODES[_expected_verdict()]


def _no_airflow_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}


def test_doctor_takes_the_schema_from_the_environment(meta):
    """``AIRFLOW__DATABASE__SQL_ALCHEMY_SCHEMA``, as every Airflow component of the deployment has it."""
    _register(meta, STOCK, register=False)
    url = meta.url.render_as_string(hide_password=False)
    _assert_report(_doctor(meta.airflow_env(), "--url", url, "--json"))


def test_doctor_takes_the_schema_from_airflow_cfg(meta, tmp_path):
    """No ``--url``: Airflow's configuration (airflow.cfg in AIRFLOW_HOME) names the database and schema."""
    _register(meta, STOCK, register=False)
    url = meta.url.render_as_string(hide_password=False)
    (tmp_path / "airflow.cfg").write_text(
        f"[database]\nsql_alchemy_conn = {url}\nsql_alchemy_schema = {SCHEMA}\n"
    )
    env = _no_airflow_env()
    env["AIRFLOW_HOME"] = str(tmp_path)
    _assert_report(_doctor(env, "--json"))


def test_doctor_takes_the_schema_as_an_option(meta, tmp_path):
    """``--schema``, where no Airflow configuration says it (an empty AIRFLOW_HOME)."""
    _register(meta, STOCK, register=False)
    env = _no_airflow_env()
    env["AIRFLOW_HOME"] = str(tmp_path)
    url = meta.url.render_as_string(hide_password=False)
    _assert_report(_doctor(env, "--url", url, "--schema", SCHEMA, "--json"))
