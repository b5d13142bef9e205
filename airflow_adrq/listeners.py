"""Listeners for registered asset events, run after the transaction commits.

A standalone replacement for Airflow's ``on_asset_changed`` /
``on_asset_event_emitted`` listener hooks. Inside Airflow the plug-in
(:mod:`airflow_adrq.airflow`) keeps Airflow's own listener manager instead.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AssetEventInfo", "Listener", "add_listener", "notify", "remove_listener"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AssetEventInfo:
    """What a listener learns about one committed asset event."""

    event_id: int
    asset_id: int
    asset_name: str
    asset_uri: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    source_dag_id: str | None = None
    source_task_id: str | None = None
    source_run_id: str | None = None
    source_map_index: int | None = None
    source_alias_names: tuple[str, ...] = ()
    partition_key: str | None = None
    partition_date: dt.datetime | None = None


Listener = Callable[[AssetEventInfo], object]

_listeners: list[Listener] = []


def add_listener(listener: Listener) -> None:
    """Call ``listener(info)`` for every asset event, after its transaction commits."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling ``listener``; unknown listeners are ignored."""
    if listener in _listeners:
        _listeners.remove(listener)


def notify(info: AssetEventInfo) -> None:
    """Call every listener with ``info``; a failing listener is logged, not raised (as Airflow does)."""
    for listener in list(_listeners):
        try:
            listener(info)
        except Exception:
            log.exception("error calling asset event listener %r", listener)
