"""The benchmark's database: a scratch database, its seed data and the exact-rows check.

The benchmark never writes to the database a URL names. It creates a scratch
database next to it (``adrq_bench_<random>`` on the same server, or a
temporary file for SQLite; see :func:`airflow_adrq.servers.create_database`),
creates Airflow's tables there from :data:`airflow_adrq.models.metadata`, and
drops it at the end.

Seed data (``dag_bundle`` "bench"):

* ``outlets`` assets ``bench_asset_<i>``; each is scheduled on by the same
  ``fanout`` unpaused DAGs ``dag_<n>`` and ``paused`` paused DAGs, which
  must never be queued;
* for the fan-out sweep, asset ``sweep_<F>`` is scheduled on by ``dag_0`` ..
  ``dag_<F-1>``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, Final, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from airflow_adrq import servers
from airflow_adrq.bench import counting
from airflow_adrq.bench.config import Sizes
from airflow_adrq.engine import create_engine
from airflow_adrq.models import (
    AssetActive,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    DagBundleModel,
    DagModel,
    DagScheduleAssetReference,
    metadata,
    utcnow,
)

__all__ = [
    "BUNDLE",
    "Pair",
    "bench_engine",
    "bench_run",
    "check_rows",
    "consumer_dags",
    "dag_id",
    "main_asset_ids",
    "queued_pairs",
    "reset",
    "scratch_database",
    "seed",
    "sweep_asset_id",
]

BUNDLE: Final = "bench"
Pair = tuple[int, str]

#: The consumer's record of the runs it created (the benchmark's stand-in
#: for ``dag_run``): one row per claim, written in the claiming transaction.
bench_metadata = sa.MetaData()
bench_run = sa.Table(
    "adrq_bench_run",
    bench_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dag_id", sa.String(250), nullable=False),
    sa.Column("queued_rows", sa.Integer, nullable=False),
)


def _t(model: type[Any]) -> sa.Table:
    """The ``Table`` of an ORM model (typed as one)."""
    return cast(sa.Table, model.__table__)


_ADRQ = _t(AssetDagRunQueue)


def dag_id(n: int) -> str:
    return f"dag_{n:05d}"


def _paused_dag_id(n: int) -> str:
    return f"paused_dag_{n:03d}"


# --- scratch database -------------------------------------------------------


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


# --- engines used by benchmark processes --------------------------------------

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
    kwargs: dict[str, Any] = {}
    if backend != "sqlite":
        kwargs = {"pool_size": pool_size, "max_overflow": 2}
    engine = create_engine(parsed, **kwargs)
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


# --- schema and seed data ------------------------------------------------------


def seed(engine: Engine, sizes: Sizes) -> None:
    """Create the tables and the benchmark's DAGs, assets and references."""
    metadata.create_all(engine)
    bench_metadata.create_all(engine)
    n_dags = max(sizes.fanout, *sizes.sweep)
    now = utcnow()
    assets = [(f"bench_asset_{i}", f"s3://bench/main/{i}") for i in range(sizes.outlets)]
    assets += [(f"sweep_{f}", f"s3://bench/sweep/{f}") for f in sizes.sweep]
    with engine.begin() as conn:
        conn.execute(sa.insert(_t(DagBundleModel)), [{"name": BUNDLE}])
        dag_rows = [_dag_row(dag_id(n), paused=False) for n in range(n_dags)]
        dag_rows += [_dag_row(_paused_dag_id(n), paused=True) for n in range(sizes.paused)]
        _insert_chunked(conn, _t(DagModel), dag_rows)
        conn.execute(
            sa.insert(_t(AssetModel)),
            [
                {"name": n, "uri": u, "group": "bench", "extra": {}, "created_at": now, "updated_at": now}
                for n, u in assets
            ],
        )
        conn.execute(sa.insert(_t(AssetActive)), [{"name": n, "uri": u} for n, u in assets])
        refs: list[dict[str, Any]] = []
        for asset_id in main_asset_ids(conn):
            consumers = [dag_id(n) for n in range(sizes.fanout)]
            consumers += [_paused_dag_id(n) for n in range(sizes.paused)]
            refs += [_ref_row(asset_id, d, now) for d in consumers]
        for fanout in sizes.sweep:
            refs += [_ref_row(sweep_asset_id(conn, fanout), dag_id(n), now) for n in range(fanout)]
        _insert_chunked(conn, _t(DagScheduleAssetReference), refs)


def _dag_row(dag: str, *, paused: bool) -> dict[str, Any]:
    return {
        "dag_id": dag,
        "is_paused": paused,
        "is_stale": False,
        "bundle_name": BUNDLE,
        "timetable_partitioned": False,
        "has_import_errors": False,
        "exceeds_max_non_backfill": False,
    }


def _ref_row(asset_id: int, dag: str, now: Any) -> dict[str, Any]:
    return {"asset_id": asset_id, "dag_id": dag, "created_at": now, "updated_at": now}


def _insert_chunked(conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    for start in range(0, len(rows), 2000):
        conn.execute(sa.insert(table), list(rows[start : start + 2000]))


def main_asset_ids(conn: Connection) -> list[int]:
    asset = _t(AssetModel)
    return list(
        conn.scalars(sa.select(asset.c.id).where(asset.c.name.like("bench_asset_%")).order_by(asset.c.id))
    )


def sweep_asset_id(conn: Connection, fanout: int) -> int:
    asset = _t(AssetModel)
    return int(conn.scalar(sa.select(asset.c.id).where(asset.c.name == f"sweep_{fanout}")) or 0)


def consumer_dags(conn: Connection, asset_ids: Sequence[int]) -> dict[int, frozenset[str]]:
    """Unpaused DAGs scheduled on each asset: what one event of it must queue."""
    ref = _t(DagScheduleAssetReference)
    dag = _t(DagModel)
    rows = conn.execute(
        sa.select(ref.c.asset_id, ref.c.dag_id)
        .join(dag, dag.c.dag_id == ref.c.dag_id)
        .where(ref.c.asset_id.in_(asset_ids), dag.c.is_paused == sa.false())
    )
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
