"""A file barrier: the benchmark's processes start and end every round together.

Each party creates ``<dir>/<name>.<party>`` and waits until all ``parties``
files exist. Files are never removed during a run, so a late poller still
sees a barrier that the others have already passed. Start skew is the poll
interval (a millisecond), small against a round.
"""

from __future__ import annotations

import time
from pathlib import Path

from airflow_adrq.errors import AdrqError

__all__ = ["BarrierTimeoutError", "arrive", "arrived", "wait"]

_POLL_S = 0.001


class BarrierTimeoutError(AdrqError):
    """Another benchmark process did not reach the barrier in time."""


def arrive(directory: Path, name: str, party: int) -> None:
    (directory / f"{name}.{party}").touch()


def arrived(directory: Path, name: str) -> int:
    return sum(1 for _ in directory.glob(f"{name}.*"))


def wait(directory: Path, name: str, party: int, parties: int, *, timeout_s: float) -> None:
    """Arrive at barrier ``name`` and return once all ``parties`` have."""
    arrive(directory, name, party)
    deadline = time.monotonic() + timeout_s
    while arrived(directory, name) < parties:
        if time.monotonic() > deadline:
            raise BarrierTimeoutError(
                f"barrier {name!r}: {arrived(directory, name)} of {parties} processes after {timeout_s:.0f} s"
            )
        time.sleep(_POLL_S)
