"""``airflow-adrq doctor`` without Airflow: refusals, read-only-ness, exposure, PgBouncer, pg_stat_statements.

An "Airflow-like" database here is the library's own tables (the Airflow 3.3
shape, airflow_adrq.models) plus the two tables doctor reads that the library
lacks: ``alembic_version`` stamped with an Airflow revision and
``task_outlet_asset_reference``. Databases made by ``airflow db migrate``
are tested in tests/plugin/test_doctor.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from airflow_adrq import cli, create_engine, doctor, migrate, register_asset_change
from airflow_adrq.airflow import compat
from airflow_adrq.models import metadata
from airflow_adrq_testing import servers
from airflow_adrq_testing.recording import recorded
from tests.factories import (
    add_alias,
    add_asset,
    add_dags,
    asset_ref,
    link_aliases,
    schedule_on_alias,
    schedule_on_asset,
    schedule_on_name,
    schedule_on_uri,
)
from tests.support import exposure
from tests.support.ci import skip_or_fail
from tests.support.exposure import exposure_fields

#: The last migration of Airflow 3.3.0 (the head of 3.3.x).
AIRFLOW_33 = "d2f4e1b3c5a7"

_EXTRA = sa.MetaData()
ALEMBIC_VERSION = sa.Table(
    "alembic_version", _EXTRA, sa.Column("version_num", sa.String(32), primary_key=True)
)
TOAR = sa.Table(
    "task_outlet_asset_reference",
    _EXTRA,
    sa.Column("asset_id", sa.Integer, primary_key=True),
    sa.Column("dag_id", sa.String(250), primary_key=True),
    sa.Column("task_id", sa.String(250), primary_key=True),
)


# First words of the statements a read-only check may send.
def airflow_like(url, revision=AIRFLOW_33):
    """The library's tables + alembic_version (stamped ``revision``) + task_outlet_asset_reference."""
    engine = create_engine(url)
    metadata.create_all(engine)
    _EXTRA.create_all(engine)
    with engine.begin() as conn:
        conn.execute(ALEMBIC_VERSION.insert(), {"version_num": revision})
    return engine


def seed_exposed(engine):
    """tests/support/exposure.py's world, in the library's tables."""
    with Session(engine) as s:
        add_dags(s, exposure.DAGS, paused=exposure.PAUSED)
        assets = {
            name: add_asset(s, name, active=name not in exposure.INACTIVE) for name in exposure.CONSUMERS
        }
        for name, dag_ids in exposure.CONSUMERS.items():
            schedule_on_asset(s, assets[name], dag_ids)
        for name, dag_ids in exposure.NAME_REF_CONSUMERS.items():
            schedule_on_name(s, name, dag_ids)
        for name, dag_ids in exposure.URI_REF_CONSUMERS.items():
            schedule_on_uri(s, asset_ref(name).uri, dag_ids)
        aliases = {name: add_alias(s, name) for name in exposure.ALIAS_CONSUMERS}
        for name, dag_ids in exposure.ALIAS_CONSUMERS.items():
            schedule_on_alias(s, aliases[name], dag_ids)
        link_aliases(s, [(aliases[alias], assets[asset]) for alias, asset in exposure.ALIAS_LINKS])
        s.commit()
    with engine.begin() as conn:
        conn.execute(
            TOAR.insert(),
            [{"asset_id": assets[a], "dag_id": d, "task_id": t} for a, d, t in exposure.OUTLETS],
        )


def run_cli(capsys, *argv):
    code = cli.main(["doctor", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- not an Airflow database: exit 4, one line ------------------------------------


def _assert_one_line_error(code, out, err, *needles):
    assert code == doctor.EXIT_NO_REPORT
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_an_empty_database_is_not_airflows(fresh_db_url, backend, capsys):
    if backend == "sqlite":
        open(sa.make_url(fresh_db_url).database, "wb").close()  # an empty database
    _assert_one_line_error(*run_cli(capsys, "--url", fresh_db_url), "no alembic_version table")


def test_the_librarys_own_database_is_not_airflows(fresh_db_url, backend, capsys):
    """Migrated by ``airflow-adrq db upgrade``: doctor names it and asks for Airflow's URL."""
    migrate.upgrade(fresh_db_url)
    _assert_one_line_error(
        *run_cli(capsys, "--url", fresh_db_url), "airflow-adrq's own database", "sql_alchemy_conn"
    )


def test_the_librarys_tables_without_version_table_are_not_airflows(fresh_db_url, backend, capsys):
    engine = create_engine(fresh_db_url)
    metadata.create_all(engine)
    engine.dispose()
    _assert_one_line_error(*run_cli(capsys, "--url", fresh_db_url), "airflow-adrq's own tables")


def test_another_alembic_application_is_not_airflow(fresh_db_url, backend, capsys):
    engine = create_engine(fresh_db_url)
    ALEMBIC_VERSION.create(engine)
    with engine.begin() as conn:
        conn.execute(ALEMBIC_VERSION.insert(), {"version_num": "0123456789ab"})
    engine.dispose()
    _assert_one_line_error(*run_cli(capsys, "--url", fresh_db_url), "is no Airflow migration")


def test_a_missing_sqlite_file_is_an_error_and_not_created(tmp_path, capsys):
    path = tmp_path / "nothing.db"
    _assert_one_line_error(*run_cli(capsys, "--url", f"sqlite:///{path}"), "no SQLite database file")
    assert not path.exists()


def test_an_unreachable_server_is_a_one_line_error(capsys):
    _assert_one_line_error(
        *run_cli(capsys, "--url", "postgresql+psycopg2://nobody@127.0.0.1:1/airflow"), "cannot read"
    )


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("postgresql+pg8000://u@127.0.0.1/airflow", "postgres"),
        ("mysql+pymysql://u@127.0.0.1/airflow", "mysql"),
    ],
)
def test_a_driver_not_installed_names_the_extra(url, extra, capsys):
    """No traceback and not a verdict: the extra that installs a driver, and "no report"."""
    for module in ("pg8000", "pymysql"):
        with contextlib.suppress(ImportError):
            __import__(module)
            pytest.fail(f"{module} is installed here: the test needs a driver that is not")
    _assert_one_line_error(*run_cli(capsys, "--url", url), f"pip install 'airflow-adrq[{extra}]'")


@pytest.mark.backends("postgresql")
def test_a_schema_that_does_not_exist_is_no_report(fresh_db_url, backend, capsys):
    airflow_like(fresh_db_url).dispose()
    code, out, err = run_cli(capsys, "--url", fresh_db_url, "--schema", "nosuchschema")
    _assert_one_line_error(code, out, err, "no such schema 'nosuchschema'")


def test_no_url_without_airflow_asks_for_one(monkeypatch, capsys):
    try:
        importlib.metadata.distribution("apache-airflow-core")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("Airflow is installed here: its configuration gives the URL")
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", raising=False)
    _assert_one_line_error(*run_cli(capsys), "pass --url")


def test_no_url_reads_airflows_environment_variable(fresh_db_url, backend, monkeypatch, capsys):
    airflow_like(fresh_db_url).dispose()
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", fresh_db_url)
    code, out, _ = run_cli(capsys, "--json")
    assert json.loads(out)["compatibility"]["schema"]["revision"] == AIRFLOW_33
    assert code == doctor.EXIT_CODES[json.loads(out)["verdict"]]


# --- read-only ----------------------------------------------------------------------


def _user_table_writes(url):
    """Rows inserted, updated and deleted in this database's tables, per pg_stat_user_tables.

    Waits until no other session is connected to the database (a backend
    flushes its counters when it exits) and reads a fresh snapshot.
    """
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        deadline = time.monotonic() + 30
        with engine.connect() as conn:
            while True:
                others = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                ).scalar()
                conn.rollback()
                if others == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            row = conn.exec_driver_sql(
                "SELECT sum(n_tup_ins), sum(n_tup_upd), sum(n_tup_del), sum(n_tup_hot_upd) "
                "FROM pg_stat_user_tables"
            ).one()
            conn.rollback()
            return tuple(int(v or 0) for v in row)
    finally:
        engine.dispose()


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_doctor_sends_only_reads_and_never_commits(fresh_db_url, backend, capsys):
    engine = airflow_like(fresh_db_url)
    seed_exposed(engine)
    engine.dispose()
    path = sa.make_url(fresh_db_url).database
    before_file = _sha256(path) if backend == "sqlite" else None
    before_stats = _user_table_writes(fresh_db_url) if backend == "postgresql" else None
    with recorded() as seen:
        code, _, err = run_cli(capsys, "--url", fresh_db_url)
    assert code in (0, 1), err
    statements = seen.normalized()
    assert statements
    # A WITH is a read if it modifies nothing (no data-modifying CTE).
    writes = seen.writes()
    assert not writes, f"doctor sent statements that are not reads: {writes}"
    assert seen.commits == 0
    if backend == "sqlite":
        assert _sha256(path) == before_file
        wal = f"{path}-wal"
        assert not os.path.exists(wal) or os.path.getsize(wal) == 0
    if backend == "postgresql":
        assert _user_table_writes(fresh_db_url) == before_stats


_REFUSED = {
    "postgresql": "read-only transaction",
    "mysql": "READ ONLY transaction",
    "sqlite": "readonly database",
}


def test_a_write_in_doctors_transaction_is_refused_by_the_server(fresh_db_url, backend):
    airflow_like(fresh_db_url).dispose()
    with doctor.read_only_connection(fresh_db_url) as conn:
        with pytest.raises(DBAPIError) as raised:
            conn.exec_driver_sql("INSERT INTO dag_bundle (name) VALUES ('written')")
        assert _REFUSED[backend] in str(raised.value.orig)
    check = create_engine(fresh_db_url)
    with check.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM dag_bundle").scalar() == 0
    check.dispose()


# --- the report -------------------------------------------------------------------


def test_exposure_counts(fresh_db_url, backend, capsys):
    engine = airflow_like(fresh_db_url)
    seed_exposed(engine)
    engine.dispose()
    report = doctor.check(fresh_db_url)
    e = report.exposure
    assert exposure_fields(e) == exposure.EXPOSURE
    c = report.compatibility
    assert c.schema == doctor.SchemaVersion(AIRFLOW_33, "3.3.0", (3, 3), True)
    assert c.queue_key == ("asset_id", "target_dag_id")
    assert c.supported, c.support
    assert set(c.dag_id_collations) >= {"dag.dag_id", "asset_dag_run_queue.target_dag_id"}
    if backend == "sqlite":
        assert report.verdict == doctor.NOT_NEEDED and "one writer" in report.reasons[0]
    else:
        assert report.verdict == doctor.ENABLE
        assert "produced by several tasks" in report.reasons[0]
        assert any("sharing a consumer DAG" in r for r in report.reasons)
    if backend == "mysql":
        assert c.storage_engine == "InnoDB"
        assert "READ COMMITTED" in c.isolation
    if backend == "postgresql":
        assert e.deadlocks is not None
        assert c.pgbouncer.detected is False

    code, out, _ = run_cli(capsys, "--url", fresh_db_url)
    assert code == report.exit_code == doctor.EXIT_CODES[report.verdict]
    assert len(out.splitlines()) <= 30, out
    assert doctor.CONFIG_LINE in out
    assert "max 3, p50 1, p99 3" in out

    code, out, _ = run_cli(capsys, "--url", fresh_db_url, "--json")
    data = json.loads(out)
    assert data["verdict"] == report.verdict and data["exit_code"] == code
    assert data["exposure"]["fanout_over"] == {"64": 0, "1024": 0}
    assert data["config"]["value"] == "airflow_adrq.airflow.AdrqAssetManager"


@pytest.mark.backends("postgresql", "mysql")
def test_one_consumer_per_asset_is_not_needed(fresh_db_url, backend):
    engine = airflow_like(fresh_db_url)
    with Session(engine) as s:
        add_dags(s, ["p", "c1", "c2"])
        schedule_on_asset(s, add_asset(s, "a"), ["c1"])
        schedule_on_asset(s, add_asset(s, "b"), ["c2"])
        s.commit()
    with engine.begin() as conn:
        conn.execute(TOAR.insert(), [{"asset_id": 1, "dag_id": "p", "task_id": "t"}])
    engine.dispose()
    report = doctor.check(fresh_db_url)
    assert report.verdict == doctor.NOT_NEEDED and report.exit_code == 1
    assert "no transaction can write two queue rows" in report.reasons[0]


@pytest.mark.backends("postgresql")
def test_no_consumers_is_not_needed(fresh_db_url, backend):
    airflow_like(fresh_db_url).dispose()
    report = doctor.check(fresh_db_url)
    assert report.verdict == doctor.NOT_NEEDED
    assert "nothing is queued" in report.reasons[0]


@pytest.mark.parametrize(
    ("revision", "needle"),
    [
        ("fe199e1abd77", "3.0"),  # 3.0.3's head: refused (SQLAlchemy 1.4)
        ("5f2621c13b39", "2.10"),  # 2.10.3's head
        ("0123456789ab", "unknown"),  # newer than this package knows
    ],
)
def test_unsupported_schema_versions(fresh_db_url, backend, revision, needle, capsys):
    airflow_like(fresh_db_url, revision).dispose()
    code, out, _ = run_cli(capsys, "--url", fresh_db_url)
    assert code == 3, out
    assert "Verdict: NOT SUPPORTED (exit 3)" in out
    assert needle in out


def test_a_shape_that_is_not_the_lines_is_not_supported(fresh_db_url, backend):
    # 3.4.0b2's last migration, with 3.3's queue key: migrated by another Airflow.
    airflow_like(fresh_db_url, "9cffe90fa0c0").dispose()
    report = doctor.check(fresh_db_url)
    assert report.verdict == doctor.NOT_SUPPORTED
    assert report.compatibility.schema.line == (3, 4)


def test_a_migration_stopped_half_way_is_warned_about(fresh_db_url, backend):
    # Airflow 3.3.0's first migration (0110): its later ones are missing.
    airflow_like(fresh_db_url, "a4c2d171ae18").dispose()
    report = doctor.check(fresh_db_url)
    assert not report.compatibility.schema.complete
    assert any("interrupted" in w for w in report.warnings)


def test_a_schema_older_than_the_lines_first_supported_release_is_warned_about(fresh_db_url, backend):
    # 3.1.0's last migration: 3.1.0 to 3.1.7 share it; the plug-in supports 3.1 from 3.1.7.
    airflow_like(fresh_db_url, "cc92b33c6709").dispose()
    report = doctor.check(fresh_db_url)
    assert compat.ADAPTERS[(3, 1)].minimum == (3, 1, 7)
    assert any("up to (not including) 3.1.8" in w and "3.1.7" in w for w in report.warnings), report.warnings


def test_schema_versions_from_revisions():
    assert doctor.schema_version(AIRFLOW_33) == doctor.SchemaVersion(AIRFLOW_33, "3.3.0", (3, 3), True)
    assert doctor.schema_version("509b94a1042d").airflow_version == "3.1.8"
    assert doctor.schema_version("cc92b33c6709") == doctor.SchemaVersion(
        "cc92b33c6709", "3.1.0", (3, 1), True
    )
    assert doctor.schema_version("nonsense").airflow_version is None


# --- PgBouncer --------------------------------------------------------------------


@contextlib.contextmanager
def _pgbouncer(server_url, **kwargs):
    try:
        with servers.pgbouncer(server_url, **kwargs) as url:
            yield url
    except servers.ServerNotFoundError as exc:
        skip_or_fail(f"PgBouncer unavailable (Debian package pgbouncer): {exc}")


def _through(bouncer_url, db_url):
    return sa.make_url(bouncer_url).set(database=sa.make_url(db_url).database)


@pytest.mark.backends("postgresql")
def test_pgbouncer_in_transaction_mode_is_detected(fresh_db_url, backend, server_info):
    airflow_like(fresh_db_url).dispose()
    with _pgbouncer(server_info.url) as bouncer:
        report = doctor.check(_through(bouncer, fresh_db_url))
    p = report.compatibility.pgbouncer
    assert p.detected is True
    assert "not allowed" in p.how  # the admin console refuses a user not in stats_users
    assert p.pool_mode == "transaction"
    assert report.exposure is not None


@pytest.mark.backends("postgresql")
def test_pgbouncer_pool_mode_from_its_admin_console(fresh_db_url, backend, server_info):
    airflow_like(fresh_db_url).dispose()
    user = sa.make_url(server_info.url).username
    with _pgbouncer(server_info.url, pool_mode="session", stats_users=[user]) as bouncer:
        report = doctor.check(_through(bouncer, fresh_db_url))
    p = report.compatibility.pgbouncer
    assert p.detected is True and "PgBouncer" in p.how
    assert p.pool_mode == "session"
    assert "SHOW DATABASES" in p.pool_mode_how


@pytest.mark.backends("postgresql")
def test_pgbouncer_session_mode_by_behaviour(fresh_db_url, backend, server_info):
    airflow_like(fresh_db_url).dispose()
    with _pgbouncer(server_info.url, pool_mode="session") as bouncer:
        report = doctor.check(_through(bouncer, fresh_db_url))
    assert report.compatibility.pgbouncer.pool_mode == "session (probably)"


# --- pg_stat_statements -------------------------------------------------------------


def _when_accepting(connect, timeout=30.0):
    """``connect()``, retried while the new server still says it is starting up (its port opens first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect()
        except DBAPIError as exc:
            if "starting up" not in str(exc.orig) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def _throwaway_postgresql_database(name, **settings):
    """A database on a throwaway PostgreSQL started with ``settings`` (``-c name=value``).

    No PostgreSQL binaries: a skip, a failure under CI (.ci/run installs them).
    """
    with contextlib.ExitStack() as stack:
        try:
            # The port opens before the server accepts connections: the start-up check may be refused.
            info = _when_accepting(lambda: stack.enter_context(servers.start_postgresql(settings=settings)))
        except servers.ServerNotFoundError as exc:
            skip_or_fail(f"no throwaway PostgreSQL (Debian package postgresql): {exc}")
        yield _when_accepting(lambda: servers.create_database(info.url, name))


def _airflow_like_with_pg_stat_statements(url):
    """:func:`airflow_like` plus ``CREATE EXTENSION pg_stat_statements`` (a contrib module).

    Not installed: a skip, a failure under CI (Debian's postgresql package ships it).
    """
    engine = airflow_like(url)
    with engine.begin() as conn:
        try:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        except DBAPIError as exc:
            skip_or_fail(f"cannot create pg_stat_statements (PostgreSQL's contrib modules): {exc.orig}")
    return engine


def _preloads_pg_stat_statements(url):
    """Whether the server has pg_stat_statements in shared_preload_libraries (its settings exist)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT current_setting('pg_stat_statements.max', true)").scalar()
    finally:
        engine.dispose()


@pytest.mark.backends("postgresql")
def test_pg_stat_statements_not_loaded(fresh_db_url, backend):
    """The extension created but not preloaded: no counts, and the note names the setting."""
    with contextlib.ExitStack() as stack:
        url = fresh_db_url
        if _preloads_pg_stat_statements(url) is not None:
            # This server preloads it: the case needs a server that does not.
            url = stack.enter_context(_throwaway_postgresql_database("doctor_pgss_off"))
        _airflow_like_with_pg_stat_statements(url).dispose()
        e = doctor.check(url).exposure
    assert e.queue_inserts is None
    assert "shared_preload_libraries" in e.queue_inserts_note


@pytest.mark.slow
@pytest.mark.backends("postgresql")
def test_pg_stat_statements_counts_the_queue_inserts(backend):
    """A throwaway server preloading pg_stat_statements: Airflow's insert and the plug-in's told apart."""
    with _throwaway_postgresql_database("doctor_pgss", shared_preload_libraries="pg_stat_statements") as url:
        engine = _airflow_like_with_pg_stat_statements(url)
        with Session(engine) as s:
            add_dags(s, ["c1", "c2"])
            asset_id = add_asset(s, "a")
            schedule_on_asset(s, asset_id, ["c1", "c2"])
            s.commit()
        for _ in range(3):  # the plug-in's statement
            with Session(engine) as s:
                register_asset_change(asset=asset_ref("a"), session=s)
                s.commit()
        with engine.begin() as conn:  # Airflow 3.3's PostgreSQL insert, as it sends it
            conn.execute(
                sa.text(
                    "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) "
                    "VALUES (:a, :d, now()) ON CONFLICT DO NOTHING"
                ),
                [{"a": asset_id, "d": "c1"}, {"a": asset_id, "d": "c2"}],
            )
        engine.dispose()
        report = doctor.check(url)
    inserts = {q.kind: q for q in report.exposure.queue_inserts}
    ours = next(q for kind, q in inserts.items() if kind.startswith("airflow-adrq"))
    theirs = next(q for kind, q in inserts.items() if kind.startswith("Airflow's own"))
    assert ours.calls == 3 and theirs.calls == 2
    # pg_stat_statements' mean execution time: measured (not a default 0), and sane.
    assert 0 < ours.mean_ms < 10_000 and 0 < theirs.mean_ms < 10_000, (ours, theirs)
    text = doctor.render_text(report)
    assert "Queue inserts" in text and "airflow-adrq's statement (INSERT ... SELECT): 3 calls" in text
