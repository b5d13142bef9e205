"""The Apache Airflow plug-in (Airflow 3.1 to 3.4; see compat.ADAPTERS).

Configure Airflow with::

    [core]
    asset_manager_class = airflow_adrq.airflow.AdrqAssetManager

``AdrqAssetManager`` and ``flush_queue`` are loaded on first access (PEP 562),
so ``import airflow_adrq.airflow`` itself needs no Airflow, and
:func:`install_triggerer_patch` can be called from ``airflow_local_settings.py``
while Airflow is still initialising.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_adrq.airflow.triggerer import (
    install_triggerer_patch,
    is_triggerer_patched,
    uninstall_triggerer_patch,
)

if TYPE_CHECKING:
    from airflow_adrq.airflow.manager import AdrqAssetManager, flush_queue

__all__ = [
    "AdrqAssetManager",
    "flush_queue",
    "install_triggerer_patch",
    "is_triggerer_patched",
    "uninstall_triggerer_patch",
]

_LAZY = {"AdrqAssetManager", "flush_queue"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from airflow_adrq.airflow import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
