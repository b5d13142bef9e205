"""The exposure half of the report: who consumes, produces and aliases which asset.

Consumers are the pairs the plug-in's statement would queue (its own UNION
and ``dag`` filter), so the counts are queue rows an event would write.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Inspector

from airflow_adrq import shapes, statement, tables
from airflow_adrq.doctor.backends import scalar
from airflow_adrq.doctor.report import FANOUT_THRESHOLDS, Exposure

#: The tables the exposure reads (``task_outlet_asset_reference`` is optional).
TABLES = frozenset(
    {"asset", "asset_active", "dag", "asset_alias", "asset_alias_asset"}
    | {f"dag_schedule_asset_{kind}reference" for kind in ("", "name_", "uri_", "alias_")}
)


@functools.cache
def queued_pairs(shape: shapes.QueueShape = shapes.PARTITIONED) -> sa.Select[Any]:
    """``SELECT asset_id, dag_id``: every (asset, consumer) pair an event of the asset would queue.

    The statement's direct, name and URI references and ``dag`` filter over
    every asset (aliases: :func:`read`). Locks nothing; for ``doctor``.
    """
    src = statement.consumers(sa.select(tables.asset.c.id.label("asset_id")).cte("ev"), with_aliases=False)
    return _filtered(sa.select(src.c.asset_id, src.c.dag_id), src.c.dag_id, shape)


def _filtered(query: sa.Select[Any], dag_id: Any, shape: shapes.QueueShape) -> sa.Select[Any]:
    """``query`` joined to ``dag`` on ``dag_id``: only the consumer DAGs ``shape`` queues for."""
    return query.join(tables.dag, tables.dag.c.dag_id == dag_id).where(*shape.consumer_filter(tables.dag.c))


def fallback_shape(inspector: Inspector, schema: str | None) -> shapes.QueueShape:
    """For a queue the plug-in cannot write: consumers filtered by the ``dag`` columns there are."""
    dag_columns = {c["name"] for c in inspector.get_columns("dag", schema=schema)}
    return shapes.QueueShape(
        "unsupported",
        partitions="timetable_partitioned" in dag_columns,
        draining="is_draining" in dag_columns,
    )


def read(conn: Connection, names: set[str], shape: shapes.QueueShape) -> Exposure:
    """The exposure of the database ``conn`` reads (tables ``names``), DAGs filtered as ``shape`` does."""
    active = "SELECT a.id FROM asset a JOIN asset_active aa ON aa.name = a.name AND aa.uri = a.uri"
    assets = set(conn.execute(sa.text(active)).scalars())
    consumers = _grouped((a, d) for a, d in conn.execute(queued_pairs(shape)) if a in assets)
    counts = sorted(len(d) for d in consumers.values())

    outlets = "SELECT asset_id, dag_id, task_id FROM task_outlet_asset_reference"
    outlet_rows = conn.execute(sa.text(outlets)).all() if "task_outlet_asset_reference" in names else []
    producers = _grouped((a, (d, t)) for a, d, t in outlet_rows)
    several = {a for a, p in producers.items() if len(p) > 1}
    multi_outlet = [s for s in _grouped(((d, t), a) for a, d, t in outlet_rows).values() if len(s) > 1]
    # The queue rows one success of each multi-outlet task writes: a consumer once per outlet it is under.
    per_success = [[d for a in assets_of for d in consumers.get(a, ())] for assets_of in multi_outlet]

    # The consumers an event emitted through an alias queues, per alias.
    ref = tables.dag_schedule_asset_alias_reference
    by_alias = _grouped(conn.execute(_filtered(sa.select(ref.c.alias_id, ref.c.dag_id), ref.c.dag_id, shape)))
    links = conn.execute(sa.text("SELECT alias_id, asset_id FROM asset_alias_asset")).all()
    alias_assets = _grouped(links)
    # An event emitted through an alias queues the alias's consumers and its asset's.
    alias_multirow = sum(
        1
        for alias_id, dags in by_alias.items()
        if len(dags) > 1
        or any(len(dags | consumers.get(a, set())) > 1 for a in alias_assets.get(alias_id, ()))
    )
    return Exposure(
        assets=len(assets),
        assets_with_consumers=len(counts),
        fanout_max=counts[-1] if counts else 0,
        fanout_p50=_percentile(counts, 0.50),
        fanout_p99=_percentile(counts, 0.99),
        fanout_over={n: sum(1 for c in counts if c > n) for n in FANOUT_THRESHOLDS},
        multi_consumer_assets=sum(1 for c in counts if c > 1),
        several_producers=len(several),
        several_producer_dags=sum(1 for a in several if len({d for d, _ in producers[a]}) > 1),
        racing=sum(1 for a in several if len(consumers.get(a, ())) > 1),
        multi_outlet_tasks=len(multi_outlet),
        multi_outlet_multirow=sum(1 for rows in per_success if len(rows) > 1),
        multi_outlet_shared=sum(1 for rows in per_success if len(set(rows)) < len(rows)),
        aliases=int(scalar(conn, "SELECT COUNT(*) FROM asset_alias") or 0),
        alias_references=sum(len(d) for d in by_alias.values()),
        alias_links=len(links),
        alias_multirow=alias_multirow,
    )


def _grouped(pairs: Iterable[Any]) -> dict[Any, set[Any]]:
    """``{key: {values}}`` of ``(key, value)`` pairs."""
    grouped: dict[Any, set[Any]] = defaultdict(set)
    for key, value in pairs:
        grouped[key].add(value)
    return grouped


def _percentile(sorted_values: list[int], q: float) -> int:
    """Nearest rank."""
    if not sorted_values:
        return 0
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]
