"""The Apache Airflow plug-in: ``[core] asset_manager_class = airflow_adrq.airflow.AdrqAssetManager``.

Every name loads on first access (PEP 562), so ``import airflow_adrq.airflow``
needs no Airflow, and the opt-in triggerer patch loads only where it is used.
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

__all__ = ["AdrqAssetManager", "flush_queue"]  # airflow_adrq.airflow.manager's
__all__ += ["install_triggerer_patch", "is_triggerer_patched", "uninstall_triggerer_patch"]  # .triggerer's


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "triggerer" if "triggerer" in name else "manager"
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
