"""The Airflow pieces :class:`~airflow_adrq.airflow.AdrqAssetManager` relies on, in one place.

Everything the plug-in takes from Airflow beyond the models is here: which
versions it accepts, and the steps of ``AssetManager.register_asset_change``
it reproduces verbatim (event source fields, listener hooks, the
``asset.updates`` metric, the multi-team arguments). A release whose
internals differ gets its difference handled here, under its name, not by
version checks scattered through the manager.

Source of every step: ``airflow/assets/manager.py`` in apache-airflow-core
3.3.2 (``register_asset_change``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from airflow_adrq import shapes
from airflow_adrq.errors import UnsupportedSchemaError

__all__ = [
    "SHAPES",
    "SUPPORTED",
    "check_supported",
    "emit_updates_metric",
    "event_source",
    "multi_team",
    "notify_listeners",
    "queue_shape",
    "team_filter_arguments",
]

#: Release lines the plug-in is written and tested against, with the schema
#: shape (airflow_adrq.shapes) their metadata database has.
SHAPES = {(3, 3): shapes.AIRFLOW_3_2}
SUPPORTED = tuple(SHAPES)

#: ``AssetManager`` members the plug-in calls or relies on; a release without
#: them is refused at import instead of failing (or silently changing) later.
REQUIRED_MEMBERS = (
    "register_asset_change",
    "_add_asset_alias_association",
    "_filter_dags_by_team",
    "_queue_partitioned_dags",
    "notify_asset_changed",
    "nofity_asset_event_emitted",
)


def _airflow_version() -> str:
    try:
        from airflow import __version__
    except ImportError:  # pragma: no cover - Airflow always has it
        return "unknown"
    return str(__version__)


def _release_line(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_supported() -> None:
    """Raise ``ImportError`` unless this Airflow is a supported release with the expected members."""
    from airflow.assets.manager import AssetManager

    version = _airflow_version()
    supported = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED)
    remedy = "Remove [core] asset_manager_class to use Airflow's own AssetManager."
    if _release_line(version) not in SUPPORTED:
        raise ImportError(
            f"airflow_adrq.airflow supports Airflow {supported} (asset_dag_run_queue keyed by "
            f"(asset_id, target_dag_id)); this is Airflow {version}. {remedy}"
        )
    missing = [name for name in REQUIRED_MEMBERS if not hasattr(AssetManager, name)]
    if missing:
        raise ImportError(
            f"airflow_adrq.airflow: Airflow {version} has no AssetManager.{', '.join(missing)}; "
            f"the plug-in was written against {supported}. {remedy}"
        )


def queue_shape(session: Any) -> shapes.QueueShape:
    """The schema shape of the metadata database, checked against this Airflow's release line.

    Catalog reads only, once per engine (:func:`airflow_adrq.shapes.detect`).
    Raises :class:`~airflow_adrq.errors.UnsupportedSchemaError` when the
    database is not the shape this Airflow's migrations make (for example
    Airflow 3.4's event-keyed queue under a 3.3 installation).
    """
    found = shapes.detect(session.connection())
    line = _release_line(_airflow_version())
    expected = SHAPES.get(line) if line is not None else None
    if found != expected:
        key = ", ".join(found.queue_key)
        raise UnsupportedSchemaError(
            f"the metadata database has the {found.name} schema (asset_dag_run_queue keyed by ({key})); "
            f"Airflow {_airflow_version()} with airflow-adrq expects "
            f"{expected.name if expected else 'a supported release'}. Run `airflow db migrate`, or remove "
            "[core] asset_manager_class to use Airflow's own manager."
        )
    return found


def event_source(task_instance: Any) -> dict[str, Any]:
    """The ``AssetEvent`` source columns Airflow 3.3 fills from the task instance."""
    return {
        "source_task_id": task_instance.task_id,
        "source_dag_id": task_instance.dag_id,
        "source_run_id": task_instance.run_id,
        "source_map_index": task_instance.map_index,
    }


def notify_listeners(
    manager: Any,
    *,
    asset_model: Any,
    asset_event: Any,
    asset_alias_models: list[Any],
    partition_key: str | None,
    partition_date: Any,
    callback_sink: list[Callable[[], None]] | None,
) -> None:
    """``on_asset_changed`` and ``on_asset_event_emitted``, inline or into ``callback_sink``, as Airflow."""
    from airflow.listeners.types import AssetEvent as ListenerAssetEvent

    asset = asset_model.to_serialized()
    listener_asset_event = ListenerAssetEvent(
        asset=asset,
        extra=asset_event.extra,
        source_dag_id=asset_event.source_dag_id,
        source_task_id=asset_event.source_task_id,
        source_run_id=asset_event.source_run_id,
        source_map_index=asset_event.source_map_index,
        source_aliases=[aam.to_serialized() for aam in asset_alias_models],
        partition_key=partition_key,
        partition_date=partition_date,
    )
    if callback_sink is None:
        manager.notify_asset_changed(asset=asset)
        manager.nofity_asset_event_emitted(asset_event=listener_asset_event)
    else:
        callback_sink.append(partial(manager.notify_asset_changed, asset=asset))
        callback_sink.append(partial(manager.nofity_asset_event_emitted, asset_event=listener_asset_event))


def multi_team() -> bool:
    """``[core] multi_team``."""
    from airflow.configuration import conf

    return bool(conf.getboolean("core", "multi_team"))


def emit_updates_metric(task_instance: Any, *, session: Any) -> str | None:
    """``asset.updates`` with the producing DAG's team (multi-team only), as Airflow; returns the team."""
    from airflow.assets import manager as airflow_manager

    team_name = None
    if task_instance and multi_team():
        from airflow.models.dag import DagModel

        team_name = DagModel.get_team_name(task_instance.dag_id, session=session)
    airflow_manager.stats.incr("asset.updates", tags=airflow_manager.prune_dict({"team_name": team_name}))
    return team_name


def team_filter_arguments(
    task_instance: Any,
    *,
    asset_model: Any,
    team_name: str | None,
    api_user_teams: set[str] | None,
    api_allow_consumer_teams: list[str] | None,
    api_allow_global_consumers: bool,
    session: Any,
) -> dict[str, Any]:
    """The source and consumer-team arguments Airflow passes to ``_filter_dags_by_team``."""
    from sqlalchemy import select

    if task_instance:
        from airflow.models.asset import TaskOutletAssetReference

        outlet_ref = session.scalar(
            select(TaskOutletAssetReference).where(
                TaskOutletAssetReference.dag_id == task_instance.dag_id,
                TaskOutletAssetReference.task_id == task_instance.task_id,
                TaskOutletAssetReference.asset_id == asset_model.id,
            )
        )
        return {
            "source_teams": {team_name} if team_name else set(),
            "allow_consumer_teams": outlet_ref.allow_consumer_teams if outlet_ref else None,
            "allow_global_consumers": outlet_ref.allow_global_consumers if outlet_ref else True,
        }
    return {
        "source_teams": api_user_teams or set(),
        "allow_consumer_teams": api_allow_consumer_teams,
        "allow_global_consumers": api_allow_global_consumers,
    }
