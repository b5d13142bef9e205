"""Opt-in: make the triggerer's asset events go through the configured manager too.

Airflow 3's ``Trigger.submit_event`` (``airflow/models/trigger.py``) calls
``AssetManager.register_asset_change`` on the *base class* it imported, not
on the ``[core] asset_manager_class`` instance, so events from asset watchers
and triggers bypass :class:`~airflow_adrq.airflow.AdrqAssetManager` and keep
Airflow's unsorted, per-event queue writes.

:func:`install_triggerer_patch` rebinds the module global ``AssetManager`` in
``airflow.models.trigger`` to the configured manager class. Trade-off: this
changes a private call site. It is checked, not blind: the patch is applied
only if ``airflow.models.trigger.AssetManager`` is still Airflow's base class
(otherwise, e.g. after an Airflow upgrade that fixed or moved the call, it
logs a warning and changes nothing), and only if the configured class is an
``AdrqAssetManager`` (otherwise it raises, since the triggerer and the task
path would then queue differently).

This module imports nothing from Airflow at import time, so it can be used
from ``airflow_local_settings.py``, which Airflow imports while it is still
initialising; the patch is then applied when ``airflow.models.trigger`` has
finished importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["install_triggerer_patch", "is_triggerer_patched", "uninstall_triggerer_patch"]

log = logging.getLogger(__name__)

_TARGET = "airflow.models.trigger"
_lock = threading.Lock()
_original: Any = None


def install_triggerer_patch() -> None:
    """Route ``Trigger.submit_event``'s asset events through the configured ``AdrqAssetManager``.

    Idempotent. If ``airflow.models.trigger`` is already imported it is
    patched now; otherwise the patch is applied right after it is imported.
    Takes no database locks and runs no SQL.
    """
    module = sys.modules.get(_TARGET)
    if module is None:
        _install_import_hook()
    elif hasattr(module, "Trigger"):
        _patch(module)
    else:
        raise RuntimeError(
            "install_triggerer_patch() was called while airflow.models.trigger is being imported; "
            "call it from airflow_local_settings.py or an Airflow plugin module instead"
        )


def uninstall_triggerer_patch() -> None:
    """Undo :func:`install_triggerer_patch` (restores Airflow's base ``AssetManager``)."""
    global _original
    with _lock:
        for finder in [f for f in sys.meta_path if isinstance(f, _PatchAfterImport)]:
            sys.meta_path.remove(finder)
        module = sys.modules.get(_TARGET)
        if module is not None and _original is not None:
            setattr(module, "AssetManager", _original)  # noqa: B010 - ModuleType has no such attribute
        _original = None


def is_triggerer_patched() -> bool:
    """Whether ``airflow.models.trigger`` currently calls an ``AdrqAssetManager`` subclass."""
    module = sys.modules.get(_TARGET)
    if module is None:
        return False
    from airflow_adrq.airflow.manager import AdrqAssetManager

    current = getattr(module, "AssetManager", None)
    return isinstance(current, type) and issubclass(current, AdrqAssetManager)


def _patch(module: ModuleType) -> None:
    global _original
    from airflow.assets import manager as airflow_manager

    from airflow_adrq.airflow.manager import AdrqAssetManager

    configured = type(airflow_manager.asset_manager)
    if not issubclass(configured, AdrqAssetManager):
        raise RuntimeError(
            f"install_triggerer_patch() needs [core] asset_manager_class to be AdrqAssetManager "
            f"(or a subclass); it is {configured.__module__}.{configured.__qualname__}"
        )
    with _lock:
        current = getattr(module, "AssetManager", None)
        if current is configured:
            return
        if current is not airflow_manager.AssetManager:
            log.warning(
                "airflow-adrq: %s.AssetManager is %r, not Airflow's base AssetManager; this Airflow "
                "version changed the triggerer call site, so the triggerer patch is not applied",
                _TARGET,
                current,
            )
            return
        _original = current
        setattr(module, "AssetManager", configured)  # noqa: B010 - ModuleType has no such attribute
    log.info("airflow-adrq: triggerer asset events now go through %s", configured.__qualname__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        # One shot: the module is imported once per process.
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def _install_import_hook() -> None:
    with _lock:
        if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchAfterImport())
