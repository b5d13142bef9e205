# mypy: ignore-errors
"""Our tables (airflow_adrq.models.metadata) against Airflow 3.3.2's, two ways.

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

import pytest
import sqlalchemy as sa
from airflow.models import import_all_models
from airflow.models.base import metadata as airflow_metadata
from sqlalchemy.dialects import postgresql, sqlite

from airflow_adrq.models import metadata as our_metadata

import_all_models()

SUBSET_TABLES = {"dag", "dag_bundle"}


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


def test_every_table_exists_in_airflow():
    assert TABLES
    assert set(TABLES) <= set(airflow_metadata.tables)


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
