"""The Airflow pieces :class:`~airflow_adrq.airflow.AdrqAssetManager` relies on, one class per release line.

Each step of ``register_asset_change`` that differs between release lines is a method of the line's
adapter, a subclass of the previous line's overriding only what that line changed (read from each
``apache-airflow-core`` wheel's ``airflow/assets/manager.py``, ``models/asset.py`` and
``models/taskinstance.py``); each adapter's docstring says what. Shared by every line, so no adapter
method: the asset lookup, ``_add_asset_alias_association``, the event flushed at once, its
``asset_alias_asset_event`` rows (inserted directly, as 3.3 does; 3.1 and 3.2 append to
``AssetAliasModel.asset_events``, lazy-loading every earlier event of the alias, apache/airflow#66853),
``_queue_partitioned_dags`` (3.2+), and the queue statement, written for the line's ``shape`` (the
schema Airflow's own migrations made; ``airflow-adrq doctor`` reads the catalog). ``callback_sink``
(3.3+) is honoured on every line: on 3.1 and 3.2 nothing in Airflow passes it, so the hooks run inline.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from airflow_adrq import shapes
from airflow_adrq.dialects import ConflictPolicy, check_policy

if TYPE_CHECKING:
    import datetime as dt

    from airflow.assets.manager import AssetManager
    from airflow.models.asset import AssetAliasModel, AssetEvent, AssetModel
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy.orm import Session

log = logging.getLogger("airflow_adrq.airflow.manager")  # where the plug-in logs

_REMEDY = "Remove [core] asset_manager_class to use Airflow's own AssetManager."
#: The producing task's coordinates an ``AssetEvent`` records as ``source_<key>``.
_SOURCE_KEYS = ("task_id", "dag_id", "run_id", "map_index")


@dataclass(frozen=True)
class Registration:
    """The arguments of one ``register_asset_change`` call that the adapters' steps read."""

    manager: type[AssetManager]
    session: Session
    task_instance: TaskInstance | None
    partition_key: str | None = None
    partition_date: dt.datetime | None = None
    callback_sink: list[Callable[[], None]] | None = None
    api_user_teams: set[str] | None = None
    api_allow_consumer_teams: list[str] | None = None
    api_allow_global_consumers: bool = True

    def run_hook(self, hook: Callable[..., None], **arguments: Any) -> None:
        """Call a listener hook now, or hand it to ``callback_sink`` (run after COMMIT) if there is one."""
        if self.callback_sink is None:
            hook(**arguments)
        else:
            self.callback_sink.append(functools.partial(hook, **arguments))


class Airflow31:
    """Airflow 3.1 from 3.1.7 (:attr:`below_minimum`), and the base of the later lines' adapters.

    No partitions (:data:`~airflow_adrq.shapes.UNPARTITIONED`), no multi-team filter; ``extra`` stored as
    given; one listener hook (``on_asset_changed`` with ``to_public()``); ``Stats.incr("asset.updates")``
    untagged; "not found" also goes to the task's log. The manager calls only these methods and
    attributes, never a version check.
    """

    line: ClassVar[tuple[int, int]] = (3, 1)
    #: The release the tests pin (tox -e airflowNN).
    tested: ClassVar[str] = "3.1.8"
    #: The first release of the line whose rows the plug-in reproduces, and why earlier ones differ.
    minimum: ClassVar[tuple[int, int, int]] = (3, 1, 7)
    below_minimum: ClassVar[str] = (
        "before 3.1.7, Airflow skips stale DAGs scheduled directly or through an alias and queues paused "
        "DAGs scheduled through Asset.ref(name=...) / Asset.ref(uri=...) (changed in 3.1.7, apache/airflow "
        "PR #60022); the plug-in queues by 3.1.7's rules"
    )
    #: The schema of this line's metadata database (``shape.partitions``: partitioned consumers exist).
    shape: ClassVar[shapes.QueueShape] = shapes.UNPARTITIONED
    #: ``AssetManager`` members the plug-in calls; a release without them is refused at import.
    required_members: ClassVar[tuple[str, ...]] = (
        "register_asset_change",
        "_add_asset_alias_association",
        "notify_asset_changed",
    )
    #: ``_filter_dags_by_team`` exists (applied with ``[core] multi_team``).
    team_filter: ClassVar[bool] = False
    #: The order the queue statement inserts (and locks) rows in, for the start-up log line.
    queue_order: ClassVar[str] = "(asset_id, dag_id)"

    @property
    def name(self) -> str:
        return f"{self.line[0]}.{self.line[1]}"

    # --- steps, in the order register_asset_change runs them ---------------

    def warn_not_found(self, call: Registration, asset: Any) -> None:
        msg = f"AssetModel {asset} not found; cannot create asset event."
        call.manager.logger().warning(msg)
        if call.task_instance is not None and hasattr(call.task_instance, "log"):
            call.task_instance.log.warning(msg)

    def event_kwargs(self, call: Registration, asset_model: AssetModel, extra: Any) -> dict[str, Any]:
        """The ``AssetEvent`` arguments (3.1: ``extra`` as given, the column's default for None)."""
        kwargs: dict[str, Any] = {"asset_id": asset_model.id, "extra": extra}
        if ti := call.task_instance:
            kwargs.update({f"source_{key}": getattr(ti, key) for key in _SOURCE_KEYS})
        return kwargs

    def notify_listeners(
        self, call: Registration, asset_model: AssetModel, event: AssetEvent, aliases: list[AssetAliasModel]
    ) -> None:
        model: Any = asset_model  # 3.1's to_public() (typed against a later line, where it is gone)
        call.run_hook(call.manager.notify_asset_changed, asset=model.to_public())

    def emit_updates_metric(self, call: Registration) -> str | None:
        """Count ``asset.updates``; return the producing DAG's team when the line tags it with one."""
        airflow_stats().incr("asset.updates")
        return None

    def multi_team(self) -> bool:
        """Whether ``_filter_dags_by_team`` applies (``[core] multi_team`` on a line that has it)."""
        if not self.team_filter:
            return False
        from airflow.configuration import conf

        return bool(conf.getboolean("core", "multi_team"))

    def team_filter_arguments(
        self, call: Registration, asset_model: AssetModel, team_name: str | None
    ) -> dict[str, Any]:
        """The source and consumer-team arguments Airflow passes to ``_filter_dags_by_team``."""
        raise NotImplementedError(f"Airflow {self.name} has no multi-team filter")

    def partition_fields(self, call: Registration) -> dict[str, Any]:
        """The partition arguments of the listener event and ``_queue_partitioned_dags`` (3.1: none)."""
        return {}


class Airflow32(Airflow31):
    """Airflow 3.2: partitioned assets (``partition_key``; ``_queue_partitioned_dags`` without a date).

    ``extra or {}``; ``on_asset_event_emitted`` too, with ``to_serialized()`` (3.2 passes it
    ``source_aliases=[]``: it iterates its alias query result twice, fixed in 3.3.2; the plug-in passes them).
    """

    line = (3, 2)
    tested = "3.2.2"
    minimum = (3, 2, 0)
    below_minimum = ""
    shape = shapes.PARTITIONED
    required_members: ClassVar[tuple[str, ...]] = (
        *Airflow31.required_members,
        "_queue_partitioned_dags",
        "nofity_asset_event_emitted",  # sic
    )

    def warn_not_found(self, call: Registration, asset: Any) -> None:
        call.manager.logger().warning("AssetModel %s not found; cannot create asset event.", asset)

    def event_kwargs(self, call: Registration, asset_model: AssetModel, extra: Any) -> dict[str, Any]:
        return {**super().event_kwargs(call, asset_model, extra or {}), "partition_key": call.partition_key}

    def partition_fields(self, call: Registration) -> dict[str, Any]:
        return {"partition_key": call.partition_key}

    def notify_listeners(
        self, call: Registration, asset_model: AssetModel, event: AssetEvent, aliases: list[AssetAliasModel]
    ) -> None:
        from airflow.listeners.types import AssetEvent as ListenerAssetEvent

        asset = asset_model.to_serialized()
        listener_event = ListenerAssetEvent(
            asset=asset,
            extra=event.extra,
            **{f"source_{key}": getattr(event, f"source_{key}") for key in _SOURCE_KEYS},
            source_aliases=[alias.to_serialized() for alias in aliases],
            **self.partition_fields(call),
        )
        call.run_hook(call.manager.notify_asset_changed, asset=asset)
        call.run_hook(call.manager.nofity_asset_event_emitted, asset_event=listener_event)


class Airflow33(Airflow32):
    """Airflow 3.3: ``partition_date``, ``callback_sink``, multi-team (team filter, team-tagged metric)."""

    line = (3, 3)
    tested = "3.3.2"
    minimum = (3, 3, 0)
    required_members: ClassVar[tuple[str, ...]] = (*Airflow32.required_members, "_filter_dags_by_team")
    team_filter = True

    def partition_fields(self, call: Registration) -> dict[str, Any]:
        return {"partition_key": call.partition_key, "partition_date": call.partition_date}

    def emit_updates_metric(self, call: Registration) -> str | None:
        team_name = None
        if call.task_instance and self.multi_team():
            from airflow.models.dag import DagModel

            team_name = DagModel.get_team_name(call.task_instance.dag_id, session=call.session)
        # Airflow's prune_dict({"team_name": team_name}): no tag without a team.
        airflow_stats().incr("asset.updates", tags={} if team_name is None else {"team_name": team_name})
        return team_name

    def team_filter_arguments(
        self, call: Registration, asset_model: AssetModel, team_name: str | None
    ) -> dict[str, Any]:
        ti = call.task_instance
        if not ti:
            return {
                "source_teams": call.api_user_teams or set(),
                "allow_consumer_teams": call.api_allow_consumer_teams,
                "allow_global_consumers": call.api_allow_global_consumers,
            }
        from airflow.models.asset import TaskOutletAssetReference
        from sqlalchemy import select

        outlet = select(TaskOutletAssetReference).filter_by(dag_id=ti.dag_id, task_id=ti.task_id)
        outlet_ref = call.session.scalar(outlet.filter_by(asset_id=asset_model.id))
        return {
            "source_teams": {team_name} if team_name else set(),
            "allow_consumer_teams": outlet_ref.allow_consumer_teams if outlet_ref else None,
            "allow_global_consumers": outlet_ref.allow_global_consumers if outlet_ref else True,
        }


class Airflow34(Airflow33):
    """Airflow 3.4: the queue is keyed per event (:data:`~airflow_adrq.shapes.EVENT_KEYED`).

    One row per (event, consumer); draining DAGs are not queued; the event records
    ``source_task_instance_id`` and the public map index (``get_public_map_index``).
    """

    line = (3, 4)
    tested = "3.4.0b2"
    minimum = (3, 4, 0)
    shape = shapes.EVENT_KEYED
    queue_order = "(dag_id, asset_event_id)"

    def event_kwargs(self, call: Registration, asset_model: AssetModel, extra: Any) -> dict[str, Any]:
        kwargs = super().event_kwargs(call, asset_model, extra)
        task_instance: Any = call.task_instance  # 3.4's TaskInstance (typed against 3.3's)
        if task_instance:
            # Imported here, as Airflow does (TaskInstance imports the asset manager).
            from airflow.models.task_coordinates import (  # type: ignore[import-not-found,unused-ignore]
                get_public_map_index,
            )

            kwargs["source_map_index"] = get_public_map_index(task_instance, session=call.session)
            kwargs["source_task_instance_id"] = task_instance.id
        return kwargs


#: The supported release lines, oldest first.
ADAPTERS = {adapter.line: adapter for adapter in (Airflow31(), Airflow32(), Airflow33(), Airflow34())}

#: Release lines the plug-in cannot run on, and why (doctor explains their schemas with it).
REFUSED: dict[tuple[int, int], str] = {
    (3, 0): "apache-airflow-core 3.0 requires SQLAlchemy < 2.0 and airflow-adrq is built on SQLAlchemy 2, "
    "so they cannot run in one environment; upgrade to Airflow 3.1 or later",
}

#: Release lines the plug-in is written and tested against, with their schema's shape (airflow_adrq.shapes).
SHAPES = {line: adapter.shape for line, adapter in ADAPTERS.items()}
SUPPORTED = tuple(SHAPES)


def airflow_stats() -> Any:
    """What Airflow's manager module counts with (3.3+: ``stats``; 3.1 and 3.2: ``Stats``).

    Read there on every call (Airflow's ``asset.updates``), so that patching it there patches it here;
    :class:`AirflowStats` keeps what it read when the settings were first built.
    """
    from airflow.assets import manager

    names = vars(manager)
    return names.get("stats") or names["Stats"]


def release_line(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an Airflow version (``"3.3.2"`` -> ``(3, 3)``); ``None`` if it has none."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


#: The keys [core] asset_manager_kwargs may hold; each but on_conflict a positive number.
MANAGER_KWARGS = ("on_conflict", "slow_write_ms", "lock_wait_s")


def check_manager_kwargs(kwargs: dict[str, Any]) -> ConflictPolicy | None:
    """The ``on_conflict`` of ``[core] asset_manager_kwargs``; :class:`ValueError` naming the fix."""
    unknown = ", ".join(repr(k) for k in sorted(set(kwargs) - set(MANAGER_KWARGS)))
    not_positive = [
        f"{key} must be a positive number, not {value!r}"
        for key, value in kwargs.items()
        if key in MANAGER_KWARGS[1:]
        and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0)
    ]
    if unknown:
        problem = f"unknown key(s) {unknown} (valid: {', '.join(MANAGER_KWARGS)})"
    elif not_positive:
        problem = not_positive[0]
    else:
        try:
            return None if kwargs.get("on_conflict") is None else check_policy(kwargs["on_conflict"])
        except ValueError as exc:
            problem = str(exc)
    raise ValueError(f"[core] asset_manager_kwargs: {problem}")


class ManagerSettings(NamedTuple):
    """What ``[core] asset_manager_kwargs`` (and ``[scheduler] use_row_level_locking``) say, checked."""

    #: Unset: ``"auto"``, or ``"refresh_after_commit"`` with ``use_row_level_locking = False`` (the
    #: scheduler then locks no queue rows on any backend).
    on_conflict: ConflictPolicy
    #: PostgreSQL's longest wait for busy consumer rows; unset: :data:`airflow_adrq.queue.LOCK_WAIT_S`.
    lock_wait_s: float
    #: Where the queue write's counters and timings go: :class:`AirflowStats`.
    metrics: AirflowStats


class AirflowStats:
    """The plug-in's :class:`~airflow_adrq.metrics.Metrics`: ``adrq.<name>`` through Airflow's own ``Stats``.

    A queue write slower than ``slow_write_ms`` also logs one WARNING.
    """

    def __init__(self, slow_write_ms: float) -> None:
        self.stats = airflow_stats()
        self.slow_write_ms = slow_write_ms

    def incr(self, name: str, value: float = 1) -> None:
        self.stats.incr(f"adrq.{name}", value)

    def timing(self, name: str, ms: float) -> None:
        self.stats.timing(f"adrq.{name}", ms)
        if name == "queue_write" and ms > self.slow_write_ms:
            log.warning("airflow-adrq: the queue write at COMMIT took %.0f ms (slow_write_ms)", ms)


def settings() -> ManagerSettings:
    """The plug-in's settings (:class:`ValueError` naming the setting). Two config reads, the rest cached."""
    from airflow.configuration import conf

    kwargs = conf.get("core", "asset_manager_kwargs", fallback="") or ""
    return _settings(kwargs, conf.getboolean("scheduler", "use_row_level_locking", fallback=True))


@functools.lru_cache(maxsize=8)
def _settings(asset_manager_kwargs: str, row_locking: bool) -> ManagerSettings:
    from airflow_adrq.queue import LOCK_WAIT_S

    kwargs = _manager_kwargs(asset_manager_kwargs)
    policy = check_manager_kwargs(kwargs) or ("auto" if row_locking else "refresh_after_commit")
    stats = AirflowStats(float(kwargs.get("slow_write_ms", 1000.0)))
    return ManagerSettings(policy, float(kwargs.get("lock_wait_s", LOCK_WAIT_S)), stats)


def conflict_policy() -> ConflictPolicy:
    """``on_conflict`` of :func:`settings`."""
    return settings().on_conflict


def lock_wait_s() -> float:
    """``lock_wait_s`` of :func:`settings`."""
    return settings().lock_wait_s


@functools.lru_cache(maxsize=8)
def _manager_kwargs(asset_manager_kwargs: str) -> dict[str, Any]:
    """``[core] asset_manager_kwargs`` parsed and checked (:class:`ValueError` naming the setting)."""
    try:
        kwargs = json.loads(asset_manager_kwargs) if asset_manager_kwargs.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"[core] asset_manager_kwargs is not JSON ({exc}): {asset_manager_kwargs}") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"[core] asset_manager_kwargs must be a JSON object, not {asset_manager_kwargs!r}")
    check_manager_kwargs(kwargs)
    return kwargs


@functools.lru_cache(maxsize=8)
def _adapter(version: str) -> Airflow31:
    line = release_line(version)
    adapter = ADAPTERS.get(line) if line else None
    patch = re.match(r"\d+\.\d+\.(\d+)", version)  # "3.4.0b2": its leading digits
    if line in REFUSED:  # (`import airflow_adrq` usually refuses these first, on their SQLAlchemy)
        why = f"does not support Airflow {version}: {REFUSED[line]}."
    elif adapter is None:
        why = f"supports Airflow {', '.join(a.name for a in ADAPTERS.values())}; this is Airflow {version}."
    elif (*adapter.line, int(patch[1]) if patch else 0) < adapter.minimum:
        why = (
            f"supports Airflow {adapter.name} from {'.'.join(map(str, adapter.minimum))}; this is Airflow "
            f"{version}: {adapter.below_minimum}. Upgrade to {adapter.tested}, or:"
        )
    else:
        return adapter
    raise ImportError(f"airflow_adrq.airflow {why} {_REMEDY}")


def current() -> Airflow31:
    """The adapter of the installed Airflow's release line (``ImportError`` if it is not supported)."""
    from airflow import __version__

    return _adapter(__version__)


def check_supported() -> Airflow31:
    """The installed Airflow's adapter, checked: ``ImportError`` naming the version and why.

    Refused: a line not in :data:`ADAPTERS` (why, from :data:`REFUSED`), a release below its minimum,
    or one whose ``AssetManager`` lacks a member its adapter calls.
    """
    from airflow import __version__
    from airflow.assets.manager import AssetManager

    adapter = current()
    missing = [name for name in adapter.required_members if not hasattr(AssetManager, name)]
    if missing:
        raise ImportError(
            f"airflow_adrq.airflow: Airflow {__version__} has no AssetManager.{', '.join(missing)}; "
            f"the plug-in was written against Airflow {adapter.tested} for the {adapter.name} line. {_REMEDY}"
        )
    return adapter
