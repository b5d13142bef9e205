"""Migrations are tested, not trusted.

The pytest-alembic defaults (single head, up/down round trip, autogenerate
against the models finds nothing), plus what autogenerate does not look at
(primary key and foreign key names, SQLite AUTOINCREMENT, MySQL collations
and AUTO_INCREMENT), the refusal to touch an Airflow database, and the
``airflow-adrq db`` command line. Each runs on SQLite, PostgreSQL and
MySQL/MariaDB, on a brand-new empty database (``fresh_db_url``).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

import airflow_adrq
from airflow_adrq import cli, migrate
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import AdrqError, AirflowSchemaError
from airflow_adrq.models import metadata

MODEL_TABLES = frozenset(metadata.tables)
HEAD = migrate.heads()[0]
# A real Airflow 3.x revision, as Airflow's alembic_version would hold it.
AIRFLOW_REVISION = "29ce7909c52b"


@pytest.fixture
def fresh_engine(fresh_db_url):
    engine = create_engine(fresh_db_url)
    yield engine
    engine.dispose()


def _tables(engine):
    return set(sa.inspect(engine).get_table_names())


def _snapshot(engine):
    """Every table's rows, sorted: the whole visible state of the database."""
    state = {}
    with engine.connect() as conn:
        for name in sorted(_tables(engine)):
            table = sa.Table(name, sa.MetaData(), autoload_with=conn)
            state[name] = sorted(tuple(row) for row in conn.execute(sa.select(table)))
    return state


def _diffs(engine):
    with engine.connect() as conn:
        return [migrate.describe_diff(diff) for diff in migrate.schema_diff(conn)]


# --- the revision history --------------------------------------------------------


def test_single_head_and_linear_numbered_history():
    """One head, no branches, and file numbers that follow the history.

    Two heads mean two revisions were written against the same parent;
    ``upgrade head`` would then be ambiguous.
    """
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert script.get_heads() == [HEAD]
    revisions = list(reversed(list(script.walk_revisions())))  # base first
    for number, revision in enumerate(revisions, start=1):
        assert revision.down_revision == (revisions[number - 2].revision if number > 1 else None)
        filename = Path(revision.path).name
        # NNNN_<airflow version the tables mirror>_<slug>.py, as Airflow names its own.
        assert re.fullmatch(rf"{number:04d}_\d+_\d+_\d+_[a-z0-9_]+\.py", filename), filename


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_script_location_is_inside_the_package_or_at_the_checkouts_top_level():
    """A wheel ships the migrations inside the package; a checkout keeps them at its top level."""
    location = migrate.script_location()
    package = Path(airflow_adrq.__file__).resolve().parent
    assert location in (package / "migrations", package.parent / "migrations")
    assert (location / "env.py").is_file()
    assert (location / "versions").is_dir()


@pytest.mark.slow
def test_db_upgrade_from_the_built_wheel(tmp_path):
    """Build the wheel from this checkout, unpack it as an install would, run ``db upgrade`` from it."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(REPO_ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("airflow_adrq-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "airflow_adrq/migrations/env.py" in names
    assert not any(name.startswith("migrations/") for name in names), "migrations outside the package"
    url = f"sqlite:///{tmp_path / 'installed.db'}"
    code = (
        "import sys; from airflow_adrq import cli, migrate; print(migrate.script_location()); "
        f"sys.exit(cli.main(['db', 'upgrade', '--url', {url!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: nothing may come from the source tree
        env={**os.environ, "PYTHONPATH": str(site)},
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    location, *report = done.stdout.splitlines()
    assert location == str(site / "airflow_adrq" / "migrations")
    assert f"applied {HEAD}: Create Airflow 3.3's asset-queueing tables." in report


# --- upgrade / downgrade ---------------------------------------------------------


def test_upgrade_downgrade_upgrade(fresh_db_url, fresh_engine):
    first = migrate.upgrade(fresh_db_url)
    assert (first.before, first.after) == (None, HEAD)
    assert [(step.direction, step.revision) for step in first.steps] == [("upgrade", HEAD)]
    assert set(first.tables_created) == MODEL_TABLES | {migrate.VERSION_TABLE}
    assert "alembic_version" not in _tables(fresh_engine)

    again = migrate.upgrade(fresh_db_url)
    assert (again.before, again.after, again.steps) == (HEAD, HEAD, ())

    down = migrate.downgrade(fresh_db_url, "base")
    assert (down.before, down.after) == (HEAD, None)
    assert set(down.tables_dropped) == MODEL_TABLES
    # Alembic keeps its (now empty) version table.
    assert _tables(fresh_engine) == {migrate.VERSION_TABLE}
    assert migrate.current(fresh_db_url) is None

    second = migrate.upgrade(fresh_db_url)
    assert (second.before, second.after) == (None, HEAD)
    assert set(second.tables_created) == MODEL_TABLES
    assert migrate.check(fresh_db_url).ok


def test_migrated_tables_take_rows_and_cascade(fresh_db_url, fresh_engine):
    """The migrated schema works with the models: inserts, server defaults, ON DELETE CASCADE."""
    migrate.upgrade(fresh_db_url)
    now = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    t = metadata.tables
    with fresh_engine.begin() as conn:
        conn.execute(t["dag_bundle"].insert().values(name="bundle"))
        conn.execute(
            t["dag"].insert().values(dag_id="consumer", is_paused=False, is_stale=False, bundle_name="bundle")
        )
        asset_id = conn.execute(
            t["asset"]
            .insert()
            .values(name="a", uri="s3://a", group="", extra={}, created_at=now, updated_at=now)
        ).inserted_primary_key[0]
        conn.execute(
            t["dag_schedule_asset_reference"]
            .insert()
            .values(asset_id=asset_id, dag_id="consumer", created_at=now, updated_at=now)
        )
        conn.execute(
            t["asset_dag_run_queue"]
            .insert()
            .values(asset_id=asset_id, target_dag_id="consumer", created_at=now)
        )
        conn.execute(t["asset_event"].insert().values(asset_id=asset_id, extra={"k": 1}, timestamp=now))
    with fresh_engine.connect() as conn:
        dag = conn.execute(sa.select(t["dag"])).one()
        assert (dag.exceeds_max_non_backfill, dag.has_import_errors, dag.timetable_partitioned) == (
            False,
            False,
            False,
        )
        dsar = conn.execute(sa.select(t["dag_schedule_asset_reference"])).one()
        assert dsar.allow_global_producers is True
        event = conn.execute(sa.select(t["asset_event"])).one()
        assert (event.source_map_index, event.extra, event.timestamp) == (-1, {"k": 1}, now)
    with fresh_engine.begin() as conn:
        conn.execute(t["asset"].delete())
    with fresh_engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t["asset_dag_run_queue"])).scalar() == 0
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(t["dag_schedule_asset_reference"])).scalar()
            == 0
        )
        # asset_event has no FK to asset: events outlive their asset.
        assert conn.execute(sa.select(sa.func.count()).select_from(t["asset_event"])).scalar() == 1


# --- migrations == models --------------------------------------------------------


def test_autogenerate_finds_no_difference(fresh_db_url, fresh_engine):
    """What ``alembic check`` checks: tables, columns, types, nullability, server defaults, indexes, FKs."""
    migrate.upgrade(fresh_db_url)
    assert _diffs(fresh_engine) == []
    assert _tables(fresh_engine) == MODEL_TABLES | {migrate.VERSION_TABLE}


def _expected_autoincrement(table):
    column = table.autoincrement_column
    return {column.name} if column is not None else set()


def test_names_and_details_autogenerate_does_not_compare(fresh_db_url, fresh_engine):
    """PK/FK names, ON DELETE, index names, autoincrement and collations equal the models'.

    Alembic matches foreign keys by their columns and ignores primary keys,
    AUTOINCREMENT and (mostly) collations; Airflow's code and DBAs refer to
    these by name, so they are compared here one by one.
    """
    migrate.upgrade(fresh_db_url)
    dialect = fresh_engine.dialect
    is_mysql = dialect.name in ("mysql", "mariadb")
    inspector = sa.inspect(fresh_engine)
    for table in metadata.sorted_tables:
        name = table.name
        pk = inspector.get_pk_constraint(name)
        assert pk["constrained_columns"] == [c.name for c in table.primary_key.columns], name
        expected_pk_name = table.primary_key.name
        if dialect.name == "sqlite" and table.dialect_options["sqlite"]["autoincrement"]:
            # "id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" is a column
            # constraint, which has no name (also in Airflow's SQLite schema).
            expected_pk_name = None
        if not is_mysql:  # MySQL names every primary key PRIMARY.
            assert pk["name"] == expected_pk_name, name

        reflected_fks = {
            fk["name"]: (
                tuple(fk["constrained_columns"]),
                fk["referred_table"],
                tuple(fk["referred_columns"]),
                (fk["options"].get("ondelete") or "").upper() or None,
            )
            for fk in inspector.get_foreign_keys(name)
        }
        expected_fks = {
            fk.name: (
                tuple(c.name for c in fk.columns),
                fk.referred_table.name,
                tuple(e.column.name for e in fk.elements),
                fk.ondelete,
            )
            for fk in table.foreign_key_constraints
        }
        assert reflected_fks == expected_fks, name

        reflected_indexes = {
            ix["name"]: (tuple(ix["column_names"]), bool(ix["unique"])) for ix in inspector.get_indexes(name)
        }
        expected_indexes = {ix.name: (tuple(c.name for c in ix.columns), ix.unique) for ix in table.indexes}
        if is_mysql:
            # InnoDB creates an index for a foreign key no other index
            # covers, named after the constraint (here: dag.bundle_name).
            # Accept exactly those, nothing else.
            for fk_name, (columns, *_rest) in expected_fks.items():
                if reflected_indexes.get(fk_name) == (columns, False):
                    del reflected_indexes[fk_name]
        assert reflected_indexes == expected_indexes, name

    if dialect.name == "sqlite":
        with fresh_engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")).all()
        autoincrement = {row.name for row in rows if "AUTOINCREMENT" in row.sql.upper()}
        assert autoincrement == {
            t.name for t in metadata.sorted_tables if t.dialect_options["sqlite"]["autoincrement"]
        }
    else:
        for table in metadata.sorted_tables:
            reflected = {
                c["name"] for c in inspector.get_columns(table.name) if c.get("autoincrement") is True
            }
            assert reflected == _expected_autoincrement(table), table.name

    if is_mysql:
        columns = sa.table(
            "COLUMNS",
            sa.column("table_schema"),
            sa.column("table_name"),
            sa.column("column_name"),
            sa.column("collation_name"),
            schema="information_schema",
        )
        with fresh_engine.connect() as conn:
            collations = {
                (row.table_name, row.column_name): row.collation_name
                for row in conn.execute(
                    sa.select(columns).where(columns.c.table_schema == sa.func.database())
                )
            }
        for table in metadata.sorted_tables:
            for column in table.columns:
                impl = column.type.dialect_impl(dialect)
                if isinstance(impl, sa.String) and not isinstance(impl, sa.JSON):
                    assert collations[(table.name, column.name)] == impl.collation, (table.name, column.name)


# --- the comparison can fail ----------------------------------------------------


def _diffs_after(fresh_db_url, fresh_engine, ddl):
    """The differences the comparison reports once ``ddl`` has changed a freshly migrated schema."""
    migrate.upgrade(fresh_db_url)
    with fresh_engine.begin() as conn:
        conn.execute(sa.text(ddl))
    return _diffs(fresh_engine)


def test_a_missing_index_is_reported(fresh_db_url, fresh_engine):
    mysql = fresh_engine.dialect.name in ("mysql", "mariadb")
    ddl = "DROP INDEX idx_next_dagrun_create_after" + (" ON dag" if mysql else "")
    assert _diffs_after(fresh_db_url, fresh_engine, ddl) == ["add_index idx_next_dagrun_create_after on dag"]
    assert not migrate.check(fresh_db_url).ok


@pytest.mark.backends("postgresql", "mysql")
def test_a_changed_server_default_is_reported(fresh_db_url, fresh_engine):
    (diff,) = _diffs_after(
        fresh_db_url, fresh_engine, "ALTER TABLE asset_event ALTER COLUMN source_map_index SET DEFAULT -2"
    )
    # PostgreSQL reflects the default as '-2'::integer.
    assert re.fullmatch(r"modify_default asset_event\.source_map_index: '?-2'?(::integer)? -> -1", diff), diff


# What the comparison normalises away on MySQL/MariaDB, and the real change next to it
# that must still show.
MYSQL_REAL_CHANGES = {
    # ``DEFAULT true`` reflects as 1 on MySQL; a change to 0 is real.
    "boolean-default-normalisation-is-not-blanket": (
        "ALTER TABLE dag_schedule_asset_reference ALTER COLUMN allow_global_producers SET DEFAULT 0",
        "modify_default dag_schedule_asset_reference.allow_global_producers: 0 -> ",
    ),
    # MariaDB's JSON is LONGTEXT + CHECK (json_valid(col)); a LONGTEXT without the check is a difference.
    "json-needs-json-not-just-longtext": (
        "ALTER TABLE dag MODIFY asset_expression LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
        "modify_type dag.asset_expression: LONGTEXT(",
    ),
}


@pytest.mark.backends("mysql")
@pytest.mark.parametrize("case", sorted(MYSQL_REAL_CHANGES))
def test_mysql_normalisation_still_reports_a_real_change(fresh_db_url, fresh_engine, case):
    ddl, reported = MYSQL_REAL_CHANGES[case]
    (diff,) = _diffs_after(fresh_db_url, fresh_engine, ddl)
    assert diff.startswith(reported), diff


# --- refusing an Airflow database ------------------------------------------------


def _make_airflow_version_table(engine):
    version = sa.Table(
        "alembic_version",
        sa.MetaData(),
        sa.Column("version_num", sa.String(32), primary_key=True),
    )
    with engine.begin() as conn:
        version.create(conn)
        conn.execute(version.insert().values(version_num=AIRFLOW_REVISION))


def _make_airflow_dag_run_table(engine):
    dag_run = sa.Table(
        "dag_run",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
    )
    with engine.begin() as conn:
        dag_run.create(conn)
        conn.execute(dag_run.insert().values(id=1, dag_id="producer", run_id="manual__1"))


AIRFLOW_LOOKALIKES = {
    "alembic_version": (_make_airflow_version_table, [f"alembic_version (revision {AIRFLOW_REVISION})"]),
    "dag_run": (_make_airflow_dag_run_table, ["dag_run"]),
}


@pytest.mark.parametrize("marker", sorted(AIRFLOW_LOOKALIKES))
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(lambda url: migrate.upgrade(url), id="upgrade"),
        pytest.param(lambda url: migrate.downgrade(url, "base"), id="downgrade"),
        pytest.param(lambda url: migrate.current(url), id="current"),
        pytest.param(lambda url: migrate.check(url), id="check"),
    ],
)
def test_refuses_an_airflow_database_and_changes_nothing(fresh_db_url, fresh_engine, marker, command):
    make, mentions = AIRFLOW_LOOKALIKES[marker]
    make(fresh_engine)
    before = _snapshot(fresh_engine)
    assert set(before) == {marker}

    with pytest.raises(AirflowSchemaError) as excinfo:
        command(fresh_db_url)

    message = str(excinfo.value)
    assert "Apache Airflow's own schema" in message
    assert "Nothing was changed" in message
    for mention in mentions:
        assert mention in message
    # Not even Alembic's version table was created.
    assert _snapshot(fresh_engine) == before


def test_cli_refuses_an_airflow_database(fresh_db_url, fresh_engine, capsys):
    _make_airflow_version_table(fresh_engine)
    before = _snapshot(fresh_engine)
    assert cli.main(["db", "upgrade", "--url", fresh_db_url]) == cli.EXIT_COULD_NOT_RUN
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("airflow-adrq: error: refusing to run airflow-adrq migrations on ")
    assert AIRFLOW_REVISION in captured.err
    assert _snapshot(fresh_engine) == before


# --- the command line ------------------------------------------------------------


def test_cli_db_commands(fresh_db_url, fresh_engine, capsys):
    shown = sa.make_url(fresh_db_url).render_as_string(hide_password=True)

    assert cli.main(["db", "current", "--url", fresh_db_url]) == 0
    assert capsys.readouterr().out == "<base>\n"

    assert cli.main(["db", "check", "--url", fresh_db_url]) == 1
    out = capsys.readouterr().out
    assert f"revision: <base> (head: {HEAD})" in out
    assert "not at head" in out

    assert cli.main(["db", "upgrade", "--url", fresh_db_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"database: {shown}"
    assert out[1] == f"applied {HEAD}: Create Airflow 3.3's asset-queueing tables."
    assert out[2].startswith("created tables: airflow_adrq_version, asset, ")
    assert out[-1] == f"revision: <base> -> {HEAD}"

    assert cli.main(["db", "upgrade", "--url", fresh_db_url]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"nothing to do: already at {HEAD}"

    assert cli.main(["db", "check", "--url", fresh_db_url]) == 0
    assert "ok: at head and identical to airflow_adrq.models" in capsys.readouterr().out

    assert cli.main(["db", "downgrade", "--url", fresh_db_url, "--revision", "base"]) == 0
    out = capsys.readouterr().out
    assert f"reverted {HEAD}" in out
    assert f"revision: {HEAD} -> <base>" in out
    assert _tables(fresh_engine) == {migrate.VERSION_TABLE}


def test_cli_downgrade_needs_an_explicit_revision(capsys):
    """A usage error (2), not "could not run" (4) nor ``db check``'s finding (1)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["db", "downgrade", "--url", "sqlite://"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: airflow-adrq db downgrade")
    assert err.endswith("error: a revision is required, e.g. `airflow-adrq db downgrade base`\n")


def test_cli_revision_is_positional_as_in_alembic(fresh_db_url, fresh_engine, capsys):
    assert cli.main(["db", "upgrade", "--url", fresh_db_url, "head"]) == 0
    assert cli.main(["db", "downgrade", "--url", fresh_db_url, "base"]) == 0
    assert f"revision: {HEAD} -> <base>" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["db", "upgrade", "--url", fresh_db_url, "head", "--revision", "base"])
    assert exited.value.code == 2
    assert "two different revisions" in capsys.readouterr().err


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out == f"airflow-adrq {airflow_adrq.__version__}\n"


def test_cli_url_from_environment(monkeypatch, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv(cli.URL_ENV, url)
    assert cli.main(["db", "upgrade"]) == 0
    assert capsys.readouterr().out.startswith(f"database: {url}\n")


def test_cli_runs_as_a_process(tmp_path):
    """Exit status and output of a real process (what an operator's script sees)."""
    url = f"sqlite:///{tmp_path / 'proc.db'}"
    env = {**os.environ, "PYTHONPATH": str(Path(airflow_adrq.__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "airflow_adrq.cli", "db", "upgrade", "--url", url],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"applied {HEAD}" in done.stdout


@pytest.mark.backends("mysql")
def test_mysql_without_explicit_timestamp_defaults_is_refused(fresh_db_url):
    """With explicit_defaults_for_timestamp off, adrq.created_at would get ON UPDATE CURRENT_TIMESTAMP."""
    engine = create_engine(fresh_db_url)

    @sa.event.listens_for(engine, "connect")
    def _off(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION explicit_defaults_for_timestamp = 0")
        cursor.close()

    try:
        with pytest.raises(AdrqError, match="explicit_defaults_for_timestamp=ON"):
            migrate.upgrade(engine)
        assert _tables(engine) == set()
    finally:
        engine.dispose()


# --- the bench subcommand plug-in ------------------------------------------------


def _fake_command(argv):
    print(f"fake command {argv}")
    return 0


def test_cli_commands_of_other_distributions_come_from_entry_points(monkeypatch, capsys):
    """``airflow-adrq NAME ...`` runs the ``airflow_adrq.commands`` entry point NAME with the rest."""
    fake = importlib.metadata.EntryPoint("fake", f"{__name__}:_fake_command", cli.COMMANDS_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [fake] if kw.get("group") == cli.COMMANDS_GROUP else real(**kw),
    )
    assert cli.main(["fake", "--size", "3"]) == 0
    assert capsys.readouterr().out == "fake command ['--size', '3']\n"
    # Not installed: an unknown command like any other; the runtime names no benchmark.
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--quick"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bench'" in err and "airflow-adrq-bench" not in err


def test_runtime_package_never_imports_the_benchmark():
    """The bench is an entry point of its own distribution: building the CLI imports none of it."""
    code = (
        "import sys; import airflow_adrq, airflow_adrq.cli, airflow_adrq.doctor, airflow_adrq.migrate; "
        "airflow_adrq.cli.build_parser(); "
        "bad = sorted(m for m in sys.modules if m.startswith(('airflow_adrq_', 'tests'))); "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_cli_names_a_missing_database_driver(monkeypatch, capsys):
    # SQLAlchemy imports the DBAPI module while creating the engine.
    monkeypatch.setitem(sys.modules, "pg8000", None)  # import raises ModuleNotFoundError
    url = "postgresql+pg8000://nobody@127.0.0.1/none"
    assert cli.main(["db", "upgrade", "--url", url]) == cli.EXIT_COULD_NOT_RUN
    err = capsys.readouterr().err
    assert err.startswith("airflow-adrq: error: no driver for postgresql+pg8000:// URLs"), err
    assert "pip install 'airflow-adrq[postgres]'" in err
