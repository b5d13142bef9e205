"""A seeded Airflow metadata scenario, and snapshots of what asset events leave behind.

Everything is written with the installed Airflow's own ORM models. Task
instances are small stand-ins carrying the attributes ``register_asset_change``
and ``TaskInstance.register_asset_changes_in_db`` read (dag_id, task_id,
run_id, map_index, try_number, dag_run.partition_key/partition_date, log; on
3.4 also id, region_id, region_index): creating real DagRuns needs serialized
DAGs and is beside the point here.

What the scenario does differently per release line is decided here, from
the plug-in's adapter for the installed line (``LINE``): partitioned DAGs
exist from 3.2, the queue is keyed per event from 3.4, triggers watch assets
through ``asset_watcher`` from 3.2 (``asset_trigger`` before).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import sqlalchemy as sa
from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
from airflow.models.asset import (
    AssetActive,
    AssetAliasModel,
    AssetModel,
    DagScheduleAssetAliasReference,
    DagScheduleAssetNameReference,
    DagScheduleAssetReference,
    DagScheduleAssetUriReference,
)
from airflow.models.dag import DagModel
from airflow.models.dagbundle import DagBundleModel

from airflow_adrq.airflow import compat
from tests import factories

BUNDLE = "adrq-bundle"
#: The plug-in's adapter for the installed Airflow (its release line's differences).
LINE = compat.current()

# Tables a test may write; emptied after every test (children first).
SCENARIO_TABLES = (
    "log",
    "partitioned_asset_key_log",
    "asset_partition_dag_run",
    "asset_dag_run_queue",
    "asset_alias_asset_event",
    "asset_alias_asset",
    "asset_event",
    "dag_schedule_asset_reference",
    "dag_schedule_asset_alias_reference",
    "dag_schedule_asset_name_reference",
    "dag_schedule_asset_uri_reference",
    "task_outlet_asset_reference",
    "asset_watcher",
    "asset_trigger",
    "trigger",
    "asset_active",
    "asset_alias",
    "asset",
    "serialized_dag",
    "dag_code",
    "dag_version",
    "dag",
    "dag_bundle_team",
    "dag_bundle",
    "team",
)


def empty(conn) -> None:
    """Delete the rows of every scenario table this release has (quoted: ``trigger`` is reserved on MySQL)."""
    existing = set(sa.inspect(conn).get_table_names())
    for name in SCENARIO_TABLES:
        if name in existing:
            conn.execute(sa.table(name).delete())


@dataclass
class Seeded:
    asset_ids: dict[str, int] = field(default_factory=dict)
    alias_ids: dict[str, int] = field(default_factory=dict)


def uri(name: str) -> str:
    return f"s3://bucket/{name}"


def seed(
    session,
    *,
    assets: list[str],
    consumers: dict[str, list[str]],
    paused: set[str] = frozenset(),
    partitioned: set[str] = frozenset(),
    alias_consumers: dict[str, list[str]] | None = None,
    name_ref_consumers: dict[str, list[str]] | None = None,
    uri_ref_consumers: dict[str, list[str]] | None = None,
    inactive: set[str] = frozenset(),
    stale: set[str] = frozenset(),
) -> Seeded:
    """Insert a bundle, DAGs, assets and schedule references; commit.

    ``consumers`` maps an asset name to the DAG ids scheduled on it directly;
    ``alias_consumers`` maps an alias name to DAG ids; ``name_ref_consumers`` /
    ``uri_ref_consumers`` map an asset name to DAGs scheduled on
    ``Asset.ref(name=...)`` / ``Asset.ref(uri=...)``.
    """
    alias_consumers = alias_consumers or {}
    name_ref_consumers = name_ref_consumers or {}
    uri_ref_consumers = uri_ref_consumers or {}
    session.add(DagBundleModel(name=BUNDLE))
    session.flush()  # dag.bundle_name has an FK but no ORM relationship to order the inserts
    dag_ids = sorted(
        {d for ds in consumers.values() for d in ds}
        | {d for ds in alias_consumers.values() for d in ds}
        | {d for ds in name_ref_consumers.values() for d in ds}
        | {d for ds in uri_ref_consumers.values() for d in ds}
        | {"producer"}
    )
    for dag_id in dag_ids:
        # Before 3.2 there are no partitioned DAGs: ``partitioned`` ones are plain consumers.
        extra = {"timetable_partitioned": dag_id in partitioned} if LINE.shape.partitions else {}
        session.add(
            DagModel(
                dag_id=dag_id,
                bundle_name=BUNDLE,
                is_paused=dag_id in paused,
                is_stale=dag_id in stale,
                **extra,
            )
        )
    session.flush()
    out = Seeded()
    for name in assets:
        model = AssetModel(name=name, uri=uri(name), group="asset")
        session.add(model)
        session.flush()
        out.asset_ids[name] = model.id
        if name not in inactive:
            session.add(AssetActive.for_asset(model))
    for alias in alias_consumers:
        model = AssetAliasModel(name=alias, group="asset")
        session.add(model)
        session.flush()
        out.alias_ids[alias] = model.id
    session.flush()
    for name, dags in consumers.items():
        for dag_id in dags:
            session.add(DagScheduleAssetReference(asset_id=out.asset_ids[name], dag_id=dag_id))
    for alias, dags in alias_consumers.items():
        for dag_id in dags:
            session.add(DagScheduleAssetAliasReference(alias_id=out.alias_ids[alias], dag_id=dag_id))
    for name, dags in name_ref_consumers.items():
        for dag_id in dags:
            session.add(DagScheduleAssetNameReference(name=name, dag_id=dag_id))
    for name, dags in uri_ref_consumers.items():
        for dag_id in dags:
            session.add(DagScheduleAssetUriReference(uri=uri(name), dag_id=dag_id))
    for dag_id in sorted(partitioned) if LINE.shape.partitions else ():
        _serialize_partitioned_dag(
            session, dag_id, [name for name, dags in consumers.items() if dag_id in dags]
        )
    session.commit()
    return out


def _serialize_partitioned_dag(session, dag_id: str, asset_names: list[str]) -> None:
    """A real serialized DAG with a PartitionedAssetTimetable: Airflow's partitioned path loads it."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, Asset, PartitionedAssetTimetable
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    assets = [Asset(name=name, uri=uri(name)) for name in asset_names]
    condition = assets[0]
    for asset in assets[1:]:
        condition = condition | asset
    with DAG(dag_id, schedule=PartitionedAssetTimetable(assets=condition)) as dag:
        EmptyOperator(task_id="t")
    SerializedDagModel.write_dag(LazyDeserializedDAG.from_dag(dag), bundle_name=BUNDLE, session=session)


def task_instance(task_id: str = "t", run_id: str = "run-1", *, partition_key=None, map_index: int = -1):
    """A stand-in for the producing TaskInstance of DAG ``producer``: the library tests' one
    (tests/factories.py) plus the other attributes Airflow reads here."""
    ti = factories.task_instance(task_id=task_id, run_id=run_id, map_index=map_index)
    ti.try_number = 1
    ti.dag_run = SimpleNamespace(partition_key=partition_key, partition_date=None)
    ti.log = logging.getLogger("adrq.test.ti")
    if LINE.line >= (3, 4):
        # 3.4 records the task instance's id and its public map index (from its region).
        from airflow.models.dynamic_region import SENTINEL_REGION_ID

        ti.id = uuid.uuid5(uuid.NAMESPACE_URL, f"{task_id}/{run_id}/{map_index}")
        ti.region_id = SENTINEL_REGION_ID
        ti.region_index = map_index
    return ti


def watch(session, trigger_id: int, asset_model) -> None:
    """Make the trigger watch the asset (``asset_watcher`` from 3.2, ``asset_trigger`` before)."""
    import airflow.models.asset as asset_models

    if hasattr(asset_models, "AssetWatcherModel"):
        session.add(
            asset_models.AssetWatcherModel(
                name=f"w-{asset_model.name}", asset_id=asset_model.id, trigger_id=trigger_id
            )
        )
    else:
        session.execute(
            sa.insert(asset_models.asset_trigger_association_table).values(
                asset_id=asset_model.id, trigger_id=trigger_id
            )
        )


def outlet(name: str | None = None, *, kind: str = "Asset", ref_uri: str | None = None) -> AssetProfile:
    if kind == "Asset":
        return AssetProfile(name=name, uri=uri(name), type="Asset")
    if kind == "AssetNameRef":
        return AssetProfile(name=name, type="AssetNameRef")
    if kind == "AssetUriRef":
        return AssetProfile(uri=ref_uri, type="AssetUriRef")
    if kind == "AssetAlias":
        return AssetProfile(name=name, type="AssetAlias")
    raise ValueError(kind)


def alias_event(alias: str, asset_name: str, extra: dict | None = None) -> dict:
    """An outlet event emitted through an alias (as the task runner reports it)."""
    return {
        "source_alias_name": alias,
        "dest_asset_key": {"name": asset_name, "uri": uri(asset_name)},
        "dest_asset_extra": {},
        "extra": extra or {},
    }


def snapshot(conn) -> dict[str, list]:
    """Contents of the tables asset events write, by names (ids and timestamps differ between runs)."""
    asset = {r.id: r.name for r in conn.execute(sa.text("SELECT id, name FROM asset"))}
    alias = {r.id: r.name for r in conn.execute(sa.text("SELECT id, name FROM asset_alias"))}
    events = {}
    partition_key = "partition_key" if LINE.shape.partitions else "NULL AS partition_key"
    for r in conn.execute(
        sa.text(
            "SELECT id, asset_id, extra, source_dag_id, source_task_id, source_run_id, source_map_index, "
            f"{partition_key} FROM asset_event"
        )
    ):
        extra = r.extra if isinstance(r.extra, dict) else json.loads(r.extra)
        events[r.id] = (
            asset[r.asset_id],
            json.dumps(extra, sort_keys=True),
            r.source_dag_id,
            r.source_task_id,
            r.source_run_id,
            r.source_map_index,
            r.partition_key,
        )
    return {
        "asset_event": sorted(events.values(), key=repr),
        "asset_alias_asset_event": sorted(
            (alias[r.alias_id], events[r.event_id])
            for r in conn.execute(sa.text("SELECT alias_id, event_id FROM asset_alias_asset_event"))
        ),
        "asset_alias_asset": sorted(
            (alias[r.alias_id], asset[r.asset_id])
            for r in conn.execute(sa.text("SELECT alias_id, asset_id FROM asset_alias_asset"))
        ),
        "asset_alias": sorted(alias.values()),
        # One (asset, DAG) per row: on 3.4 one per event, so a pair can repeat.
        "asset_dag_run_queue": sorted(
            (asset[r.asset_id], r.target_dag_id)
            for r in conn.execute(sa.text("SELECT asset_id, target_dag_id FROM asset_dag_run_queue"))
        ),
        # 3.4: which event each row stands for.
        "asset_dag_run_queue_events": sorted(
            (
                (asset[r.asset_id], r.target_dag_id, events[r.asset_event_id])
                for r in conn.execute(
                    sa.text("SELECT asset_id, target_dag_id, asset_event_id FROM asset_dag_run_queue")
                )
            ),
            key=repr,
        )
        if LINE.shape.event_keyed
        else [],
        "asset_partition_dag_run": sorted(
            (r.target_dag_id, r.partition_key)
            for r in conn.execute(sa.text("SELECT target_dag_id, partition_key FROM asset_partition_dag_run"))
        )
        if LINE.shape.partitions
        else [],
        "partitioned_asset_key_log": sorted(
            (
                asset[r.asset_id],
                events[r.asset_event_id],
                r.target_dag_id,
                r.source_partition_key,
                r.target_partition_key,
            )
            for r in conn.execute(
                sa.text(
                    "SELECT asset_id, asset_event_id, target_dag_id, source_partition_key, "
                    "target_partition_key FROM partitioned_asset_key_log"
                )
            )
        )
        if LINE.shape.partitions
        else [],
        # Log.extra names asset ids, which differ between runs: compare the events.
        "log": sorted(r.event for r in conn.execute(sa.text("SELECT event FROM log"))),
    }
