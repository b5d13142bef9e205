"""Our tables and our statement against the installed Airflow's schema.

On every release line (scoped to what the plug-in writes there):

3. Statement: every table and column the plug-in's queue statement reads or
   writes for this line's schema shape (``compat.current().shape``), and the
   event ``timestamp`` it stamps, exists in Airflow's metadata with the same
   kind of type, and in the database ``airflow db migrate`` created on each
   backend; the queue's primary key is the shape's key; and the statement
   writes every NOT NULL queue column that has no default.

On the line whose schema ``airflow_adrq.models`` reproduces (3.3, the
library's own tables; 3.1/3.2 lack columns it has, 3.4 keys the queue
differently), the whole tables as well:

1. Metadata: every table, column (type as compiled for PostgreSQL and SQLite,
   nullability, primary key), primary key, foreign key (columns, target,
   ON DELETE, name), index (name, columns, uniqueness) equals Airflow's
   ``airflow.models.base.metadata``. ``dag`` and ``dag_bundle`` are documented
   column subsets: their columns (and what hangs off them) must be a subset.
2. Database: on each backend, the DDL our metadata creates, reflected, equals
   what ``airflow db migrate`` created (this is where MySQL/MariaDB collations
   are compared: Airflow decides them from its connection URL at import time).
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from airflow.models import import_all_models
from airflow.models.base import metadata as airflow_metadata
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import visitors

from airflow_adrq import manager, statement
from airflow_adrq.doctor.compatibility import detect
from airflow_adrq.models import metadata as our_metadata
from tests.plugin.adrq_af_scenario import LINE

import_all_models()

SUBSET_TABLES = {"dag", "dag_bundle"}

#: Whole-table parity only where our models are this line's schema.
whole_tables = pytest.mark.skipif(
    LINE.line != (3, 3),
    reason=f"airflow_adrq.models is Airflow 3.3's schema; on {LINE.name} only what the statement uses",
)


def _compare(ours, theirs, what):
    assert ours == theirs, what


TABLES = sorted(our_metadata.tables)
DIALECTS = {"postgresql": postgresql.dialect(), "sqlite": sqlite.dialect()}


def _columns(table):
    return {
        c.name: (
            {name: str(c.type.compile(dialect=d)) for name, d in DIALECTS.items()},
            c.nullable,
            c.primary_key,
        )
        for c in table.columns
    }


def _foreign_keys(table):
    return {
        (
            fk.name,
            tuple(c.name for c in fk.columns),
            tuple(e.target_fullname for e in fk.elements),
            (fk.ondelete or "").upper() or None,
        )
        for fk in table.foreign_key_constraints
    }


def _indexes(table):
    return {(ix.name, tuple(c.name for c in ix.columns), bool(ix.unique)) for ix in table.indexes}


def _uniques(table):
    return {
        (uq.name, tuple(c.name for c in uq.columns))
        for uq in table.constraints
        if isinstance(uq, sa.UniqueConstraint)
    }


@whole_tables
def test_every_table_exists_in_airflow():
    assert TABLES
    assert set(TABLES) <= set(airflow_metadata.tables)


@whole_tables
@pytest.mark.parametrize("name", TABLES)
def test_table_matches_airflow_metadata(name):
    ours, theirs = our_metadata.tables[name], airflow_metadata.tables[name]
    our_cols, their_cols = _columns(ours), _columns(theirs)
    pk = (ours.primary_key.name, tuple(c.name for c in ours.primary_key.columns))
    assert pk == (theirs.primary_key.name, tuple(c.name for c in theirs.primary_key.columns))
    if name in SUBSET_TABLES:
        assert set(our_cols) < set(their_cols), "a documented subset must stay a subset"
        assert _foreign_keys(ours) <= _foreign_keys(theirs)
        assert _indexes(ours) <= _indexes(theirs)
        _compare(our_cols, {c: their_cols[c] for c in our_cols}, name)
    else:
        assert _foreign_keys(ours) == _foreign_keys(theirs)
        assert _indexes(ours) == _indexes(theirs)
        assert _uniques(ours) == _uniques(theirs)
        _compare(our_cols, their_cols, name)


def _reflect(engine, names):
    inspector = sa.inspect(engine)
    out = {}
    for name in names:
        out[name] = {
            "columns": {c["name"]: (repr(c["type"]), c["nullable"]) for c in inspector.get_columns(name)},
            "pk": tuple(inspector.get_pk_constraint(name)["constrained_columns"]),
            "fks": {
                (
                    fk["name"],
                    tuple(fk["constrained_columns"]),
                    fk["referred_table"],
                    tuple(fk["referred_columns"]),
                    (fk.get("options", {}).get("ondelete") or "").upper() or None,
                )
                for fk in inspector.get_foreign_keys(name)
            },
            "indexes": {
                (ix["name"], tuple(ix["column_names"]), bool(ix["unique"]))
                for ix in inspector.get_indexes(name)
                # MySQL/MariaDB add an index per FK that lacks one; not part of the model.
                if not ix.get("duplicates_constraint")
            },
        }
    return out


@whole_tables
def test_created_schema_matches_the_migrated_database(airflow_db):
    migrated = airflow_db.engine()
    scratch = sa.create_engine(airflow_db.scratch_url)
    try:
        our_metadata.create_all(scratch)
        ours, theirs = _reflect(scratch, TABLES), _reflect(migrated, TABLES)
        for name in TABLES:
            o, t = ours[name], theirs[name]
            assert o["pk"] == t["pk"], name
            if name in SUBSET_TABLES:
                assert o["columns"] == {c: t["columns"][c] for c in o["columns"]}, name
                assert o["fks"] <= t["fks"], name
                assert {ix for ix in o["indexes"] if ix[0] != "dag_bundle_name_fkey"} <= t["indexes"], name
            else:
                assert o["columns"] == t["columns"], name
                assert o["fks"] == t["fks"], name
                assert o["indexes"] == t["indexes"], name
    finally:
        our_metadata.drop_all(scratch)
        scratch.dispose()
        migrated.dispose()


# --- 3. what the statement uses, on every line --------------------------------


def _statement_columns(shape) -> tuple[dict[str, set[str]], set[str]]:
    """(table -> columns the plug-in's statements read or write, the queue columns the INSERT writes)."""
    insert = manager.build_queue_statement("postgresql", shape=shape)
    used: dict[str, set[str]] = {}
    for stmt in (insert, statement.consumers_of_events()):
        for element in visitors.iterate(stmt, {"column_collections": True}):
            table = getattr(element, "table", None)
            if isinstance(element, sa.sql.expression.ColumnClause) and type(table) in (
                sa.Table,
                sa.sql.expression.TableClause,
            ):
                used.setdefault(table.name, set()).add(element.name)
    sql = str(insert.compile(dialect=postgresql.dialect()))
    target = re.search(r"INSERT INTO asset_dag_run_queue \(([^)]*)\)", sql)
    written = {name.strip() for name in target.group(1).split(",")}
    used.setdefault(insert.table.name, set()).update(written)
    # The commit-time stamp: UPDATE asset_event SET timestamp = :stamp WHERE id IN (...).
    used.setdefault("asset_event", set()).add("timestamp")
    return used, written


def _kind(column_type) -> type:
    """What a column holds, across dialect spellings (UtcDateTime -> datetime, StringID -> str...)."""
    column_type = getattr(column_type, "impl_instance", column_type)
    try:
        return column_type.python_type
    except NotImplementedError:  # pragma: no cover - every type used here has one
        return object


USED, WRITTEN = _statement_columns(LINE.shape)


def test_statement_columns_exist_in_this_lines_metadata():
    assert {"asset_dag_run_queue", "asset_event", "dag", "dag_schedule_asset_reference"} <= set(USED)
    for table_name, columns in sorted(USED.items()):
        theirs = airflow_metadata.tables[table_name]
        ours = our_metadata.tables.get(table_name)
        for name in sorted(columns):
            assert name in theirs.c, f"Airflow {LINE.tested} has no {table_name}.{name}"
            if ours is not None and name in ours.c:
                assert _kind(ours.c[name].type) == _kind(theirs.c[name].type), f"{table_name}.{name}"


def test_queue_key_and_required_columns_match_this_lines_metadata():
    adrq = airflow_metadata.tables["asset_dag_run_queue"]
    assert {c.name for c in adrq.primary_key.columns} == set(LINE.shape.queue_key)
    required = {
        c.name for c in adrq.columns if not c.nullable and c.default is None and c.server_default is None
    }
    assert required <= WRITTEN, f"the statement must write {sorted(required - WRITTEN)}"


def test_statement_columns_exist_in_the_migrated_database(airflow_db):
    migrated = airflow_db.engine()
    try:
        inspector = sa.inspect(migrated)
        for table_name, columns in sorted(USED.items()):
            reflected = {c["name"] for c in inspector.get_columns(table_name)}
            assert columns <= reflected, f"{table_name}: missing {sorted(columns - reflected)}"
        pk = inspector.get_pk_constraint("asset_dag_run_queue")["constrained_columns"]
        assert set(pk) == set(LINE.shape.queue_key)
        with migrated.connect() as conn:
            assert detect(conn) == LINE.shape
    finally:
        migrated.dispose()
