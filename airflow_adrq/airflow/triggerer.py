"""Opt-in: make the triggerer's asset events go through the configured manager too.

Airflow 3's ``Trigger.submit_event`` (``airflow/models/trigger.py``) calls ``register_asset_change`` on the
base ``AssetManager`` it imported, not on ``[core] asset_manager_class``, so events from asset watchers and
triggers keep Airflow's unsorted, per-event queue writes. :func:`install_triggerer_patch` rebinds that module
global to the configured class: a private call site, so it is checked (README, "Triggerer and asset
watchers"). Nothing from Airflow is imported at import time, so ``airflow_local_settings.py``, imported while
Airflow is still initialising, can call it (the patch then waits for ``airflow.models.trigger``).
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

    Idempotent. If ``airflow.models.trigger`` is already imported it is patched now; otherwise right
    after it is imported. Applied only while that module's ``AssetManager`` is still Airflow's base class
    (else a warning, nothing changed); :class:`RuntimeError` unless ``[core] asset_manager_class`` is an
    ``AdrqAssetManager`` (the triggerer and the task path would queue differently). Takes no database
    locks and runs no SQL.
    """
    module = sys.modules.get(_TARGET)
    if module is None:
        with _lock:
            if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _PatchAfterImport())
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
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchAfterImport)]
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


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``airflow.models.trigger`` once, loads it with its own loader, then patches it."""

    _loader: importlib.abc.Loader

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one shot: the module is imported once per process
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)
