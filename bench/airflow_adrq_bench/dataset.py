"""The benchmark's database: a scratch database, its seed data and the exact-rows check.

The benchmark never writes to the database a URL names. It creates a scratch
database next to it (``adrq_bench_<random>`` on the same server, or a
temporary file for SQLite; see :func:`airflow_adrq_testing.servers.create_database`),
creates Airflow's tables there from :data:`airflow_adrq.models.metadata`, and
drops it at the end.

Seed data (``dag_bundle`` "bench"):

* ``outlets`` assets ``bench_asset_<i>``; each is scheduled on by the same
  ``fanout`` unpaused DAGs ``dag_<n>`` and ``paused`` paused DAGs, which
  must never be queued;
* per producer party ``p``, ``outlets`` warm-up assets ``bench_warm_<p>_<i>``
  with the same consumers (a cell's warm-up transactions touch no row the
  others touch, so they cannot block or deadlock each other);
* for the fan-out sweep and the raw-SQL ratio, asset ``sweep_<F>`` is
  scheduled on by ``dag_0`` .. ``dag_<F-1>``;
* for ``lost_events``, asset ``lost_asset`` scheduled on by
  ``lost_consumers`` DAGs ``lost_dag_<k>`` (nothing else schedules on them),
  and per party a warm-up asset ``lost_warm_<p>`` with the same consumers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from airflow_adrq import queue
from airflow_adrq.engine import create_engine
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
from airflow_adrq_bench.config import Sizes
from airflow_adrq_testing import servers
from airflow_adrq_testing.recording import counting

__all__ = [
    "BUNDLE",
    "Pair",
    "SeedAsset",
    "bench_engine",
    "bench_run",
    "check_rows",
    "consumer_dags",
    "dag_id",
    "lost_asset",
    "lost_dag_ids",
    "lost_warm_asset",
    "main_asset_ids",
    "main_assets",
    "queued_pairs",
    "reset",
    "scratch_database",
    "seed",
    "seed_fan",
    "sweep_asset",
    "sweep_asset_id",
    "warm_assets",
]

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


def _warm_name(party: int, i: int) -> str:
    return f"bench_warm_{party}_{i}"


def _lost_dag_id(k: int) -> str:
    return f"lost_dag_{k}"


def seed(engine: Engine, sizes: Sizes) -> None:
    """Create the tables and the benchmark's DAGs, assets and references."""
    metadata.create_all(engine)
    bench_metadata.create_all(engine)
    parties = max(sizes.producers, sizes.lost_producers)
    now = utcnow()
    main = [(f"bench_asset_{i}", f"s3://bench/main/{i}") for i in range(sizes.outlets)]
    warm = [
        (_warm_name(p, i), f"s3://bench/warm/{p}/{i}")
        for p in range(1, parties + 1)
        for i in range(sizes.outlets)
    ]
    sweeps = sorted({*sizes.sweep, *sizes.ratio_fanouts})
    sweep = [(f"sweep_{f}", f"s3://bench/sweep/{f}") for f in sweeps]
    lost = [("lost_asset", "s3://bench/lost")]
    lost += [(f"lost_warm_{p}", f"s3://bench/lost-warm/{p}") for p in range(1, parties + 1)]
    assets = main + warm + sweep + lost
    with engine.begin() as conn:
        conn.execute(sa.insert(_t(DagBundleModel)), [{"name": BUNDLE}])
        dag_rows = [_dag_row(dag_id(n), paused=False) for n in range(sizes.max_fanout)]
        dag_rows += [_dag_row(_paused_dag_id(n), paused=True) for n in range(sizes.paused)]
        dag_rows += [_dag_row(_lost_dag_id(k), paused=False) for k in range(sizes.lost_consumers)]
        _insert_chunked(conn, _t(DagModel), dag_rows)
        _insert_chunked(
            conn,
            _t(AssetModel),
            [
                {"name": n, "uri": u, "group": "bench", "extra": {}, "created_at": now, "updated_at": now}
                for n, u in assets
            ],
        )
        _insert_chunked(conn, _t(AssetActive), [{"name": n, "uri": u} for n, u in assets])
        ids = _asset_ids_by_name(conn)
        consumers = [dag_id(n) for n in range(sizes.fanout)]
        consumers += [_paused_dag_id(n) for n in range(sizes.paused)]
        lost_consumers = [_lost_dag_id(k) for k in range(sizes.lost_consumers)]
        refs: list[dict[str, Any]] = []
        for name, _uri in main + warm:
            refs += [_ref_row(ids[name], d, now) for d in consumers]
        for fanout in sweeps:
            refs += [_ref_row(ids[f"sweep_{fanout}"], dag_id(n), now) for n in range(fanout)]
        for name, _uri in lost:
            refs += [_ref_row(ids[name], d, now) for d in lost_consumers]
        _insert_chunked(conn, _t(DagScheduleAssetReference), refs)


def _asset_ids_by_name(conn: Connection) -> dict[str, int]:
    asset = _t(AssetModel)
    return {str(n): int(i) for n, i in conn.execute(sa.select(asset.c.name, asset.c.id))}


def _assets_where(conn: Connection, condition: sa.ColumnElement[bool]) -> list[SeedAsset]:
    asset = _t(AssetModel)
    rows = conn.execute(
        sa.select(asset.c.id, asset.c.name, asset.c.uri).where(condition).order_by(asset.c.id)
    )
    return [SeedAsset(int(i), str(n), str(u)) for i, n, u in rows]


def main_assets(conn: Connection) -> list[SeedAsset]:
    """The ``outlets`` assets every producer of the contention scenarios emits."""
    return _assets_where(conn, _t(AssetModel).c.name.like("bench_asset_%"))


def warm_assets(conn: Connection, party: int) -> list[SeedAsset]:
    """Producer party ``party``'s own warm-up assets (same consumers as the main assets)."""
    names = [_warm_name(party, i) for i in range(len(main_assets(conn)))]
    found = {a.name: a for a in _assets_where(conn, _t(AssetModel).c.name.in_(names))}
    return [found[n] for n in names]


def sweep_asset(conn: Connection, fanout: int) -> SeedAsset:
    (asset,) = _assets_where(conn, _t(AssetModel).c.name == f"sweep_{fanout}")
    return asset


def lost_asset(conn: Connection) -> SeedAsset:
    (asset,) = _assets_where(conn, _t(AssetModel).c.name == "lost_asset")
    return asset


def lost_warm_asset(conn: Connection, party: int) -> SeedAsset:
    (asset,) = _assets_where(conn, _t(AssetModel).c.name == f"lost_warm_{party}")
    return asset


def lost_dag_ids(conn: Connection) -> list[str]:
    """The consumer DAGs of ``lost_asset``, sorted."""
    dag = _t(DagModel)
    return list(
        conn.scalars(sa.select(dag.c.dag_id).where(dag.c.dag_id.like("lost_dag_%")).order_by(dag.c.dag_id))
    )


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
    return [a.id for a in main_assets(conn)]


def sweep_asset_id(conn: Connection, fanout: int) -> int:
    return sweep_asset(conn, fanout).id


def consumer_dags(conn: Connection, asset_ids: Sequence[int]) -> dict[int, frozenset[str]]:
    """The DAGs one event of each asset must queue, as the queue statement defines them.

    :func:`airflow_adrq.queue.queued_pairs`: the statement's references (but
    aliases) and its ``dag`` filter, not a second copy of them.
    """
    pairs = queue.queued_pairs().subquery()
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


def seed_fan(engine: Engine, prefix: str, *, outlets: int, fanout: int) -> list[tuple[str, str]]:
    """Tables plus ``outlets`` active assets each scheduled on by the same ``fanout`` DAGs; (name, uri)s.

    The small data set of ``bench --faults`` and ``bench --soak``: DAGs
    ``<prefix>_dag_<n>`` in bundle ``<prefix>``, assets ``<prefix>_asset_<i>``.
    """
    now = utcnow()
    assets = [(f"{prefix}_asset_{i}", f"s3://{prefix}/{i}") for i in range(outlets)]
    dags = [f"{prefix}_dag_{n:04d}" for n in range(fanout)]
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(DagBundleModel), [{"name": prefix}])
        conn.execute(
            sa.insert(DagModel),
            [{"dag_id": d, "is_paused": False, "is_stale": False, "bundle_name": prefix} for d in dags],
        )
        conn.execute(sa.insert(AssetModel), [{"name": n, "uri": u} for n, u in assets])
        conn.execute(sa.insert(AssetActive), [{"name": n, "uri": u} for n, u in assets])
        ids = [i for (i,) in conn.execute(sa.select(AssetModel.id).order_by(AssetModel.id))]
        conn.execute(
            sa.insert(DagScheduleAssetReference),
            [{"asset_id": a, "dag_id": d, "created_at": now, "updated_at": now} for a in ids for d in dags],
        )
    return assets
