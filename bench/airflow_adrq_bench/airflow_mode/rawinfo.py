"""The fields every ``--airflow`` mode's raw results open and close with.

What ran, when, on how many CPUs and under what load: the three modes'
reports print the load average, so its keys must be the same in all of them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["finish", "opening"]


def opening(tool: str, sizes: DataclassInstance, managers: Sequence[str]) -> dict[str, Any]:
    """The first fields of a raw result: the tool, the start time, CPUs, load, sizes, managers."""
    return {
        "tool": tool,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        # Other work on the machine skews every number: the 1/5/15-minute load at start and end.
        "load_average": {"start": list(os.getloadavg())},
        "sizes": dataclasses.asdict(sizes),
        "managers": list(managers),
    }


def finish(raw: dict[str, Any], started: float, *, ndigits: int | None = None) -> None:
    """Add the run's duration since ``started`` (``time.monotonic()``) and the load at its end."""
    elapsed = time.monotonic() - started
    # round(x, None) would be an int: only round when asked to.
    raw["duration_s"] = elapsed if ndigits is None else round(elapsed, ndigits)
    raw["load_average"]["end"] = list(os.getloadavg())
