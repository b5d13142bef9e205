"""The Apache Airflow plug-in (Airflow 3.1 to 3.4; see compat.ADAPTERS).

Configure Airflow with::

    [core]
    asset_manager_class = airflow_adrq.airflow.AdrqAssetManager

Every name is loaded on first access (PEP 562): ``import airflow_adrq.airflow``
itself needs no Airflow; ``AdrqAssetManager`` loads the plug-in path
(:mod:`airflow_adrq.airflow.manager`), and the opt-in triggerer patch
(:mod:`airflow_adrq.airflow.triggerer`) loads only where it is used, from
``airflow_local_settings.py`` while Airflow is still initialising.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_adrq.airflow.manager import AdrqAssetManager, flush_queue
    from airflow_adrq.airflow.triggerer import (
        install_triggerer_patch,
        is_triggerer_patched,
        uninstall_triggerer_patch,
    )

__all__ = [
    "AdrqAssetManager",
    "flush_queue",
    "install_triggerer_patch",
    "is_triggerer_patched",
    "uninstall_triggerer_patch",
]

_LAZY = {
    "AdrqAssetManager": "manager",
    "flush_queue": "manager",
    "install_triggerer_patch": "triggerer",
    "is_triggerer_patched": "triggerer",
    "uninstall_triggerer_patch": "triggerer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
