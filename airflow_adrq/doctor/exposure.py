"""The exposure half of the report: who consumes, produces and aliases which asset.

Consumers are the pairs the plug-in's statement would queue
(:func:`queued_pairs`, :func:`alias_consumers`:
its own UNION and ``dag`` filter), so the counts are queue rows an event would write.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence
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
    every asset (aliases: :func:`alias_consumers`). Locks nothing; for
    ``doctor``.
    """
    src = statement.consumers(sa.select(tables.asset.c.id.label("asset_id")).cte("ev"), with_aliases=False)
    return (
        sa.select(src.c.asset_id, src.c.dag_id)
        .join(tables.dag, tables.dag.c.dag_id == src.c.dag_id)
        .where(*shape.consumer_filter(tables.dag.c))
    )


@functools.cache
def alias_consumers(shape: shapes.QueueShape = shapes.PARTITIONED) -> sa.Select[Any]:
    """``SELECT alias_id, dag_id``: the consumers an event emitted through an alias queues, per alias."""
    by_alias = tables.dag_schedule_asset_alias_reference
    return (
        sa.select(by_alias.c.alias_id, by_alias.c.dag_id)
        .join(tables.dag, tables.dag.c.dag_id == by_alias.c.dag_id)
        .where(*shape.consumer_filter(tables.dag.c))
    )


def fallback_shape(inspector: Inspector, schema: str | None) -> shapes.QueueShape:
    """For a queue the plug-in cannot write: consumers filtered by the ``dag`` columns there are."""
    dag_columns = {c["name"] for c in inspector.get_columns("dag", schema=schema)}
    return shapes.QueueShape(
        "unsupported",
        partitions="timetable_partitioned" in dag_columns,
        draining="is_draining" in dag_columns,
    )


def read(conn: Connection, tables: set[str], shape: shapes.QueueShape) -> Exposure:
    """The exposure of the database ``conn`` reads, whose DAGs are filtered as ``shape`` filters them."""
    active = "asset a JOIN asset_active aa ON aa.name = a.name AND aa.uri = a.uri"
    assets = {int(a) for (a,) in conn.execute(sa.text(f"SELECT a.id FROM {active}"))}
    consumers: dict[int, set[str]] = defaultdict(set)
    for asset_id, dag_id in conn.execute(queued_pairs(shape)):
        if int(asset_id) in assets:
            consumers[int(asset_id)].add(str(dag_id))
    counts = sorted(len(d) for d in consumers.values())

    producers: dict[int, set[tuple[str, str]]] = defaultdict(set)
    outlets: dict[tuple[str, str], set[int]] = defaultdict(set)
    if "task_outlet_asset_reference" in tables:
        for asset_id, dag_id, task_id in conn.execute(
            sa.text("SELECT asset_id, dag_id, task_id FROM task_outlet_asset_reference")
        ):
            producers[int(asset_id)].add((str(dag_id), str(task_id)))
            outlets[(str(dag_id), str(task_id))].add(int(asset_id))
    several = {a for a, p in producers.items() if len(p) > 1}
    several_dags = {a for a in several if len({d for d, _ in producers[a]}) > 1}
    racing = {a for a in several if len(consumers.get(a, ())) > 1}

    multi_outlet = [assets_of for assets_of in outlets.values() if len(assets_of) > 1]
    multirow = shared = 0
    for assets_of in multi_outlet:
        rows_per_success = [d for a in assets_of for d in consumers.get(a, ())]
        multirow += len(rows_per_success) > 1
        shared += len(set(rows_per_success)) < len(rows_per_success)

    alias_count = int(scalar(conn, "SELECT COUNT(*) FROM asset_alias") or 0)
    by_alias: dict[int, set[str]] = defaultdict(set)
    for alias_id, dag_id in conn.execute(alias_consumers(shape)):
        by_alias[int(alias_id)].add(str(dag_id))
    links = conn.execute(sa.text("SELECT alias_id, asset_id FROM asset_alias_asset")).all()
    alias_assets: dict[int, set[int]] = defaultdict(set)
    for alias_id, asset_id in links:
        alias_assets[int(alias_id)].add(int(asset_id))
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
        several_producer_dags=len(several_dags),
        racing=len(racing),
        multi_outlet_tasks=len(multi_outlet),
        multi_outlet_multirow=multirow,
        multi_outlet_shared=shared,
        aliases=alias_count,
        alias_references=sum(len(d) for d in by_alias.values()),
        alias_links=len(links),
        alias_multirow=alias_multirow,
    )


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]
