"""The data set the tests and ``airflow-adrq bench`` share: scratch databases, seed data, exact rows.

Nothing is written to the database a URL names: :func:`scratch_database`
creates one next to it (``adrq_bench_<random>`` on the same server, or a
temporary file for SQLite; see :func:`airflow_adrq_testing.servers.create_database`)
and drops it at the end; :func:`seed` creates Airflow's tables there from
:data:`airflow_adrq.models.metadata`.

Seed data (``dag_bundle`` "bench", :func:`seed`):

* ``outlets`` assets ``bench_asset_<i>``; each is scheduled on by the same
  ``fanout`` unpaused DAGs ``dag_<n>`` and ``paused`` paused DAGs, which
  must never be queued;
* per producer party ``p``, ``outlets`` warm-up assets ``bench_warm_<p>_<i>``
  with the same consumers (a round's warm-up transactions touch no row the
  others touch, so they cannot block or deadlock each other);
* for the fan-out sweep and the raw-SQL ratio, asset ``sweep_<F>`` is
  scheduled on by ``dag_0`` .. ``dag_<F-1>``;
* for ``lost_events``, asset ``lost_asset`` scheduled on by
  ``lost_consumers`` DAGs ``lost_dag_<k>`` (nothing else schedules on them),
  and per party a warm-up asset ``lost_warm_<p>`` with the same consumers.

``bench --faults``, ``bench --soak`` and the residual race run on a smaller
data set of their own (:func:`seed_fan`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from airflow_adrq.doctor import exposure
from airflow_adrq.engine import create_engine
from airflow_adrq.errors import UnsupportedDialectError
from airflow_adrq.models import (
    AssetActive,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagBundleModel,
    DagModel,
    DagScheduleAssetReference,
    UtcDateTime,
    metadata,
    utcnow,
)
from airflow_adrq_testing import servers
from airflow_adrq_testing.recording import counting

BUNDLE: Final = "bench"
Pair = tuple[int, str]

#: The consumer's record of the runs it created (the benchmark's stand-in
#: for ``dag_run``): one row per claim, written in the claiming transaction.
#: ``run_after`` and ``consumed_events`` are set by the ``lost_events``
#: consumer (Airflow 3.3.2's rule), which reads the previous ``run_after``.
bench_metadata = sa.MetaData()
bench_run = sa.Table(
    "adrq_bench_run",
    bench_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dag_id", sa.String(250), nullable=False),
    sa.Column("queued_rows", sa.Integer, nullable=False),
    sa.Column("run_after", UtcDateTime(), nullable=True),
    sa.Column("consumed_events", sa.Integer, nullable=True),
    sa.Index("idx_adrq_bench_run_dag_run_after", "dag_id", "run_after"),
)


@dataclass(frozen=True)
class SeedAsset:
    """A seeded asset: its id, and the ``name`` / ``uri`` that ``register_asset_change`` looks up."""

    id: int
    name: str
    uri: str


def _t(model: type[Any]) -> sa.Table:
    """The ``Table`` of an ORM model (typed as one)."""
    return cast(sa.Table, model.__table__)


_ADRQ, _ASSET, _DAG = _t(AssetDagRunQueue), _t(AssetModel), _t(DagModel)


def dag_id(n: int) -> str:
    return f"dag_{n:05d}"


@dataclass(frozen=True)
class Target:
    """A database server to benchmark: its name in the tables, its backend (``mysql`` for MariaDB too),
    its URL (with the driver the mode runs on) and its version."""

    name: str
    backend: str
    server_url: str
    version: str


def describe(url: str, driver: Callable[[str], str] = str) -> Target:
    """The server at ``url`` (connects once; SQLite: the library's version), its URL through ``driver``."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return Target("sqlite", "sqlite", url, f"SQLite {sqlite3.sqlite_version}")
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in servers.BACKENDS:
        raise UnsupportedDialectError(
            f"unsupported database {parsed.drivername!r}: PostgreSQL, MySQL/MariaDB or SQLite"
        )
    version = servers.server_version(url)
    return Target("mariadb" if version.startswith("MariaDB") else backend, backend, driver(url), version)


def unique_names(targets: Sequence[Target]) -> list[Target]:
    """``postgresql``, ``postgresql-2``, ...: two servers of one kind stay apart."""
    seen: dict[str, int] = {}
    unique = []
    for target in targets:
        seen[target.name] = n = seen.get(target.name, 0) + 1
        unique.append(target if n == 1 else dataclasses.replace(target, name=f"{target.name}-{n}"))
    return unique


def server_backend(url: str, purpose: str) -> str:
    """``postgresql`` or ``mysql`` (MariaDB too): the servers ``purpose`` can run on; else ValueError."""
    backend = sa.make_url(url).get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in ("postgresql", "mysql"):
        raise ValueError(f"{purpose} needs PostgreSQL or MySQL/MariaDB, not {backend}")
    return backend


@contextlib.contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """A new empty database on the server of ``url``, dropped on exit; yields its URL.

    For SQLite the database is a temporary file, whatever file ``url`` names.
    """
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="adrq-bench-") as tmp:
            yield str(parsed.set(database=os.path.join(tmp, "bench.db")))
        return
    if backend not in servers.BACKENDS:
        raise ValueError(f"the benchmark does not support {backend!r} URLs")
    name = f"adrq_bench_{secrets.token_hex(4)}"
    scratch = servers.create_database(parsed, name)
    try:
        yield scratch
    finally:
        servers.drop_database(parsed, name)


#: Bounded waits, so a round cannot hang: (statement, seconds) per backend.
_LOCK_TIMEOUT: Final[dict[str, str]] = {
    "postgresql": "SET lock_timeout = '{ms}ms'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = {s}",
}


def bench_engine(url: str | URL, *, lock_timeout_s: float, pool_size: int = 2) -> Engine:
    """:func:`airflow_adrq.engine.create_engine` plus bounded lock waits and statement counting.

    Lock waits end with an error after ``lock_timeout_s`` (PostgreSQL
    ``lock_timeout``, InnoDB ``innodb_lock_wait_timeout``; SQLite keeps its
    busy timeout), so a round cannot hang. Deadlock detection stays at the
    server's settings (PostgreSQL ``deadlock_timeout``).
    """
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    pool: dict[str, Any] = {} if backend == "sqlite" else {"pool_size": pool_size, "max_overflow": 2}
    engine = create_engine(parsed, **pool)
    setting = _LOCK_TIMEOUT.get(backend)
    if setting is not None:
        statement = setting.format(ms=int(lock_timeout_s * 1000), s=max(1, round(lock_timeout_s)))

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(statement)
            cursor.close()
            dbapi_connection.commit()

    counting.count_statements(engine)
    return engine


def seed(
    engine: Engine,
    *,
    fanout: int,
    outlets: int,
    paused: int,
    parties: int,
    sweeps: Sequence[int] = (),
    lost_consumers: int = 1,
) -> None:
    """Create the tables and the data set above, with warm-up assets for ``parties`` producers."""
    bench_metadata.create_all(engine)
    paused_dags = [f"paused_dag_{n:03d}" for n in range(paused)]
    consumers = [dag_id(n) for n in range(fanout)] + paused_dags
    lost_dags = [f"lost_dag_{k}" for k in range(lost_consumers)]
    every = range(1, parties + 1)
    # (name, uri, consumer DAGs) of every asset.
    assets = [(f"bench_asset_{i}", f"s3://bench/main/{i}", consumers) for i in range(outlets)]
    assets += [
        (f"bench_warm_{p}_{i}", f"s3://bench/warm/{p}/{i}", consumers) for p in every for i in range(outlets)
    ]
    assets += [
        (f"sweep_{f}", f"s3://bench/sweep/{f}", [dag_id(n) for n in range(f)]) for f in sorted(set(sweeps))
    ]
    assets += [("lost_asset", "s3://bench/lost", lost_dags)]
    assets += [(f"lost_warm_{p}", f"s3://bench/lost-warm/{p}", lost_dags) for p in every]
    unpaused = [dag_id(n) for n in range(max(fanout, *sweeps, 0))] + lost_dags
    _seed(engine, BUNDLE, unpaused, paused_dags, assets)


def seed_fan(engine: Engine, prefix: str, *, outlets: int, fanout: int) -> list[SeedAsset]:
    """Tables plus ``outlets`` active assets each scheduled on by the same ``fanout`` DAGs.

    The small data set of ``bench --faults``, ``bench --soak`` and the
    residual race: DAGs ``<prefix>_dag_<n>`` in bundle ``<prefix>``, assets
    ``<prefix>_asset_<i>``.
    """
    dags = [f"{prefix}_dag_{n:04d}" for n in range(fanout)]
    assets = [(f"{prefix}_asset_{i}", f"s3://{prefix}/{i}", dags) for i in range(outlets)]
    _seed(engine, prefix, dags, [], assets)
    with engine.connect() as conn:
        return _assets_where(conn, _ASSET.c.name.like(f"{prefix}_asset_%"))


def _seed(
    engine: Engine,
    bundle: str,
    unpaused: Sequence[str],
    paused: Sequence[str],
    assets: Sequence[tuple[str, str, Sequence[str]]],
) -> None:
    """Airflow's tables, then the bundle, its DAGs, the active assets and who schedules on each."""
    metadata.create_all(engine)
    now = utcnow()
    dag = {
        "is_stale": False,
        "bundle_name": bundle,
        "timetable_partitioned": False,
        "has_import_errors": False,
    }
    dag["exceeds_max_non_backfill"] = False
    with engine.begin() as conn:
        conn.execute(sa.insert(_t(DagBundleModel)), [{"name": bundle}])
        dags = [{**dag, "dag_id": d, "is_paused": False} for d in unpaused]
        _insert_chunked(conn, _DAG, dags + [{**dag, "dag_id": d, "is_paused": True} for d in paused])
        stamps = {"created_at": now, "updated_at": now}
        rows = [{"name": n, "uri": u, "group": bundle, "extra": {}, **stamps} for n, u, _ in assets]
        _insert_chunked(conn, _ASSET, rows)
        _insert_chunked(conn, _t(AssetActive), [{"name": n, "uri": u} for n, u, _ in assets])
        ids = {str(n): int(i) for n, i in conn.execute(sa.select(_ASSET.c.name, _ASSET.c.id))}
        refs = [{"asset_id": ids[n], "dag_id": d, **stamps} for n, _, ds in assets for d in ds]
        _insert_chunked(conn, _t(DagScheduleAssetReference), refs)
    # Statistics, as a live database has them (autovacuum; InnoDB samples on its own): without
    # them PostgreSQL takes every table for a few rows, and plans of the raw-SQL reference
    # that join the consumers to dag became nested loops over sequential scans (3 s at F=1,024).
    command = _ANALYZE.get(engine.dialect.name)
    if command is not None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(command)


_ANALYZE = {"postgresql": "ANALYZE", "sqlite": "ANALYZE"}


def _insert_chunked(conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    for start in range(0, len(rows), 2000):
        conn.execute(sa.insert(table), list(rows[start : start + 2000]))


def _assets_where(conn: Connection, condition: sa.ColumnElement[bool]) -> list[SeedAsset]:
    rows = conn.execute(
        sa.select(_ASSET.c.id, _ASSET.c.name, _ASSET.c.uri).where(condition).order_by(_ASSET.c.id)
    )
    return [SeedAsset(int(i), str(n), str(u)) for i, n, u in rows]


def main_assets(conn: Connection) -> list[SeedAsset]:
    """The ``outlets`` assets every producer of the contention scenarios emits."""
    return _assets_where(conn, _ASSET.c.name.like("bench_asset_%"))


def main_asset_ids(conn: Connection) -> list[int]:
    return [a.id for a in main_assets(conn)]


def warm_assets(conn: Connection, party: int) -> list[SeedAsset]:
    """Producer party ``party``'s own warm-up assets (same consumers as the main assets)."""
    names = [f"bench_warm_{party}_{i}" for i in range(len(main_assets(conn)))]
    found = {a.name: a for a in _assets_where(conn, _ASSET.c.name.in_(names))}
    return [found[n] for n in names]


def asset(conn: Connection, name: str) -> SeedAsset:
    """The seeded asset ``name``: ``sweep_<F>``, ``lost_asset`` or ``lost_warm_<p>``."""
    (found,) = _assets_where(conn, _ASSET.c.name == name)
    return found


def lost_dag_ids(conn: Connection) -> list[str]:
    """The consumer DAGs of ``lost_asset``, sorted."""
    return list(
        conn.scalars(sa.select(_DAG.c.dag_id).where(_DAG.c.dag_id.like("lost_dag_%")).order_by(_DAG.c.dag_id))
    )


def consumer_dags(conn: Connection, asset_ids: Sequence[int]) -> dict[int, frozenset[str]]:
    """The DAGs one event of each asset must queue, as the queue statement defines them.

    :func:`airflow_adrq.doctor.exposure.queued_pairs`: the statement's references (but
    aliases) and its ``dag`` filter, not a second copy of them.
    """
    pairs = exposure.queued_pairs().subquery()
    rows = conn.execute(sa.select(pairs.c.asset_id, pairs.c.dag_id).where(pairs.c.asset_id.in_(asset_ids)))
    out: dict[int, set[str]] = {a: set() for a in asset_ids}
    for asset_id, dag_name in rows:
        out[asset_id].add(dag_name)
    return {a: frozenset(d) for a, d in out.items()}


def reset(engine: Engine) -> None:
    """Empty the queue, the events and the consumer's runs."""
    with engine.begin() as conn:
        for table in (_ADRQ, _t(AssetEvent), bench_run):
            conn.execute(sa.delete(table))


def queued_pairs(conn: Connection) -> set[Pair]:
    return {(int(a), str(d)) for a, d in conn.execute(sa.select(_ADRQ.c.asset_id, _ADRQ.c.target_dag_id))}


def check_rows(queued: set[Pair], emitted: set[Pair], consumed: set[Pair]) -> dict[str, int]:
    """Exact accounting of the queue after a round (all counts must be 0).

    ``emitted``: (asset, unpaused consumer) pairs of every committed producer
    transaction; ``consumed``: pairs the consumer deleted in committed
    transactions. Every queued row must have been emitted; every emitted
    pair must be queued or consumed (nothing lost); the consumer must only
    have consumed emitted pairs. Without a consumer this is
    ``queued == emitted``.
    """
    return {
        "unexpected": len(queued - emitted),
        "missing": len(emitted - queued - consumed),
        "consumed_unemitted": len(consumed - emitted),
    }
