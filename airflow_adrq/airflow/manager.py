"""``AdrqAssetManager``: Airflow's ``AssetManager`` with the set-based, commit-time queue write.

``register_asset_change`` follows the installed Airflow's step by step (what differs between lines:
:mod:`airflow_adrq.airflow.compat`), except for the consumers. Airflow loads every consumer ``DagModel``
and inserts one queue row per DAG (3.4: per DAG and event) in Python ``set`` order: at fan-out 1,024 the
loading alone costs more than our whole write, and up to 3.3 the set order deadlocks. Here one ordered
``INSERT ... SELECT`` just before COMMIT queues every event of the transaction
(:func:`airflow_adrq.deferral.defer_events`). Only the consumers Airflow's own code needs are loaded:
the partitioned ones, or with ``[core] multi_team`` all of them (the filter's result restricts the
statement: still one statement).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, bindparam, exists, false, insert, or_, select
from sqlalchemy.orm import joinedload

from airflow_adrq import deferral, queue, statement, tables
from airflow_adrq.airflow import compat
from airflow_adrq.deferral import flush_queue
from airflow_adrq.dialects import ConflictPolicy

if TYPE_CHECKING:
    import datetime as dt

    from airflow.models.dag import DagModel
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.definitions.assets import SerializedAsset, SerializedAssetUniqueKey
    from sqlalchemy.orm import Session

__all__ = ["AdrqAssetManager", "flush_queue"]

log = logging.getLogger(__name__)

# ImportError on an Airflow whose AssetManager this class was not written against.
compat.check_supported()

from airflow.assets.manager import AssetManager  # noqa: E402
from airflow.models.asset import (  # noqa: E402
    AssetAliasModel,
    AssetDagRunQueue,
    AssetEvent,
    AssetModel,
    asset_alias_asset_event_association_table,
)


# Without Airflow installed (mypy's own env) AssetManager is Any.
class AdrqAssetManager(AssetManager):  # type: ignore[misc,unused-ignore]
    """Airflow ``AssetManager`` whose non-partitioned queueing is one ordered statement at COMMIT.

    Set ``[core] asset_manager_class = airflow_adrq.airflow.AdrqAssetManager``.

    Locks: while registering, what Airflow's code locks (the new event and alias rows; the partitioned
    path's ``asset`` row). Just before the session's outermost COMMIT, as
    :func:`airflow_adrq.queue.queue_events`: where the scheduler locks rows (and not for 3.4's per-event
    queue), every consumer's ``dag`` row ``FOR SHARE`` (PostgreSQL: waiting for a busy one holding
    none, at most ``lock_wait_s``: :mod:`airflow_adrq.dialects.postgresql`), then the queue rows of all
    its events by one statement in the queue's key order (``(asset_id, target_dag_id)``; 3.4:
    ``(target_dag_id, asset_event_id)``), and the transaction's ``asset_event`` rows, stamped.

    Does not promise: queue rows visible before COMMIT in the producing transaction (:func:`flush_queue`),
    or written at all when the caller commits other than by ``Session.commit()``. A failing queue write
    fails the COMMIT, and so the whole transaction, not the registration call.
    """

    def __init__(
        self, *, on_conflict: ConflictPolicy | None = None, slow_write_ms: float = 1000.0, **kwargs: Any
    ) -> None:
        """Refuse a bad ``[core] asset_manager_kwargs`` at start-up; keep its ``slow_write_ms``.

        Registrations read the same setting through :func:`compat.settings` (a classmethod has no
        instance to keep it on): nothing is stored here.
        """
        compat.check_manager_kwargs({"on_conflict": on_conflict, "slow_write_ms": slow_write_ms, **kwargs})
        super().__init__()  # type: ignore[no-untyped-call,unused-ignore]
        manager = f"{type(self).__module__}.{type(self).__qualname__}"
        _log_in_use(manager, compat.current().queue_order, compat.conflict_policy())

    @classmethod
    def register_asset_change(
        cls,
        *,
        task_instance: TaskInstance | None = None,
        asset: SerializedAsset | AssetModel | SerializedAssetUniqueKey,
        extra: Any = None,
        source_alias_names: Collection[str] = (),
        session: Session,
        partition_key: str | None = None,
        partition_date: dt.datetime | None = None,
        source_is_api: bool = False,
        api_user_teams: set[str] | None = None,
        api_allow_consumer_teams: list[str] | None = None,
        api_allow_global_consumers: bool = True,
        callback_sink: list[Callable[[], None]] | None = None,
        **kwargs: Any,
    ) -> AssetEvent | None:
        """The installed Airflow line's ``register_asset_change``, queueing at COMMIT with one statement."""
        line = compat.current()
        call = compat.Registration(
            manager=cls,
            session=session,
            task_instance=task_instance,
            partition_key=partition_key,
            partition_date=partition_date,
            callback_sink=callback_sink,
            api_user_teams=api_user_teams,
            api_allow_consumer_teams=api_allow_consumer_teams,
            api_allow_global_consumers=api_allow_global_consumers,
        )

        # Airflow's lookup without ``scheduled_dags -> dag``: no consumer is
        # loaded. It also asks whether a partitioned consumer exists (3.2+),
        # so that the usual event, with none, costs no round trip for them.
        found = session.execute(
            _asset_lookup(line.shape.partitions),
            {"name": asset.name, "uri": asset.uri, "alias_names": list(source_alias_names)},
            execution_options=_IN_SCHEMA,  # the partitioned consumers' tables
        )
        asset_model, any_partitioned = found.unique().first() or (None, False)
        if not asset_model:
            line.warn_not_found(call, asset)
            return None
        if not asset_model.active:
            cls.logger().warning("Emitting event for inactive AssetModel %s", asset)

        # Airflow calls it for every event; without alias names it can only
        # run a SELECT with an empty IN list and add nothing: a round trip saved.
        if source_alias_names:
            cls._add_asset_alias_association(
                alias_names=source_alias_names, asset_model=asset_model, session=session
            )

        asset_event = AssetEvent(**line.event_kwargs(call, asset_model, extra))
        session.add(asset_event)
        session.flush()  # the event id, for the alias rows and the queue statement

        aliases: list[AssetAliasModel] = []
        if source_alias_names:
            by_name = select(AssetAliasModel).where(AssetAliasModel.name.in_(source_alias_names))
            aliases = list(session.scalars(by_name))
            for alias in aliases:
                link = {"alias_id": alias.id, "event_id": asset_event.id}
                session.execute(insert(asset_alias_asset_event_association_table).values(link))

        line.notify_listeners(call, asset_model, asset_event, aliases)
        team_name = line.emit_updates_metric(call)

        allowed: set[str] | None = None
        partition_dags: list[DagModel] = []
        if line.multi_team():
            consumers = cls._filter_dags_by_team(
                dags_to_queue=_consumer_dags(session, asset_event.id),
                asset_model=asset_model,
                source_is_api=source_is_api,
                session=session,
                **line.team_filter_arguments(call, asset_model, team_name),
            )
            partition_dags = [dag for dag in consumers if dag.timetable_partitioned is True]
            allowed = {dag.dag_id for dag in consumers} - {dag.dag_id for dag in partition_dags}
        elif any_partitioned:
            partition_dags = list(_consumer_dags(session, asset_event.id, only_partitioned=True))

        if partition_dags:
            cls._queue_partitioned_dags(
                asset_id=asset_model.id,
                partition_dags=partition_dags,
                event=asset_event,
                **line.partition_fields(call),
                task_instance=task_instance,
                session=session,
            )
        # As Airflow: an event with a partition key queues no non-partitioned
        # DAG (a line without partitions has no such key: Airflow ignores it).
        if (partition_key is None or not line.shape.partitions) and (allowed is None or allowed):
            settings = compat.settings()
            deferral.defer_events(
                session,
                [asset_event],
                allowed_dags=None if allowed is None else {asset_event.id: allowed},
                # The row keeps the newest stamp of the events it stands for
                # where the scheduler locks the rows it consumes (GUARANTEES.md, "Timing").
                on_conflict=settings.on_conflict,
                shape=line.shape,
                schema=_SCHEMA,
                lock_wait_s=settings.lock_wait_s,
                metrics=settings.metrics,
            )
            if source_is_api or "timestamp" in kwargs:
                # Airflow's REST route (POST /api/v2/assets/events; 3.1 and 3.2 pass a timestamp= Airflow
                # ignores) serializes the event before its COMMIT: stamp and queue it now, so the response
                # carries its stored timestamp. One event per transaction there: nothing to order against.
                deferral.flush_queue(session)
        return asset_event


@functools.cache
def _log_in_use(manager: str, queue_order: str, policy: ConflictPolicy) -> None:
    """Let an operator confirm in any component's log that the plug-in is used: once per process.

    Airflow builds the manager on every ``resolve_asset_manager()`` call (at import, and again in
    some code paths); the policy is the one registrations read (what ``"auto"`` means on the backend
    is logged at the first queue write).
    """
    log.info(
        "airflow-adrq: %s queues asset-triggered runs at commit, sorted by %s, on_conflict=%s",
        manager,
        queue_order,
        policy,
    )


# [database] sql_alchemy_schema or None: read off Airflow's own model, where it writes.
_SCHEMA: str | None = AssetDagRunQueue.__table__.schema or None
_IN_SCHEMA = queue.in_schema(_SCHEMA)  # for our Core tables in Airflow's schema


def _consumer_dags(session: Session, event_id: int, *, only_partitioned: bool = False) -> set[DagModel]:
    """Unpaused consumer ``DagModel``s of one event (only the partitioned ones if asked)."""
    params = {"event_ids": [event_id]}
    return set(session.scalars(_consumers(only_partitioned), params, execution_options=_IN_SCHEMA))


@functools.cache
def _consumers(only_partitioned: bool) -> Any:
    """``SELECT dag`` (as ``DagModel``) of an event's unpaused consumers (partitioned ones only if asked)."""
    # Imported here, as Airflow does: airflow.models.dag imports airflow.assets.manager (loading us).
    from airflow.models.dag import DagModel

    dag = DagModel.__table__
    consumers = statement.consumers_of_events().subquery()
    conditions = _consumer_filter(dag, only_partitioned=only_partitioned)
    return select(DagModel).where(dag.c.dag_id.in_(select(consumers.c.dag_id)), *conditions)


def _consumer_filter(dag: Any, *, only_partitioned: bool) -> list[Any]:
    """The conditions on ``dag`` of a consumer Airflow queues, partitioned or not (or only partitioned)."""
    conditions = compat.current().shape.consumer_filter(dag.c, include_partitioned=True)
    return [*conditions, dag.c.timetable_partitioned.is_(True)] if only_partitioned else conditions


@functools.cache
def _asset_lookup(partitions: bool) -> Any:
    """``SELECT asset, <any partitioned consumer>`` by ``:name`` and ``:uri``, with Airflow's eager loads."""
    return (
        select(AssetModel, _partitioned_consumer_exists() if partitions else false())
        .where(AssetModel.name == bindparam("name"), AssetModel.uri == bindparam("uri"))
        .options(joinedload(AssetModel.active), joinedload(AssetModel.aliases))
    )


def _partitioned_consumer_exists() -> Any:
    """Whether an unpaused partitioned DAG is scheduled on asset ``:name``/``:uri`` or ``:alias_names``.

    What :func:`_consumer_dags` would find for the event about to be written: one ``EXISTS`` per kind of
    reference, each from the reference table's primary key to ``dag``'s (an ``IN (UNION ...)`` over
    ``dag`` made MariaDB read every DAG).
    """
    # Aliases of their own: nothing here correlates with the lookup's tables.
    asset, alias = tables.asset.alias("p_asset"), tables.asset_alias.alias("p_alias")
    dag = tables.dag.alias("p_dag")
    direct, by_name = tables.dag_schedule_asset_reference, tables.dag_schedule_asset_name_reference
    by_uri, by_alias = tables.dag_schedule_asset_uri_reference, tables.dag_schedule_asset_alias_reference
    name, uri = bindparam("name", type_=String()), bindparam("uri", type_=String())
    partitioned = _consumer_filter(dag, only_partitioned=True)

    def scheduled_through(references: Any, dag_id: Any, *conditions: Any) -> Any:
        joined = references.join(dag, dag.c.dag_id == dag_id)
        return exists().select_from(joined).where(*conditions, *partitioned).correlate(None)

    return or_(
        scheduled_through(
            direct.join(asset, asset.c.id == direct.c.asset_id),
            direct.c.dag_id,
            asset.c.name == name,
            asset.c.uri == uri,
        ),
        scheduled_through(by_name, by_name.c.dag_id, by_name.c.name == name),
        scheduled_through(by_uri, by_uri.c.dag_id, by_uri.c.uri == uri),
        scheduled_through(
            by_alias.join(alias, alias.c.id == by_alias.c.alias_id),
            by_alias.c.dag_id,
            alias.c.name.in_(bindparam("alias_names", expanding=True)),
        ),
    ).label("any_partitioned")
