"""A file barrier: the benchmark's processes start and end every round together.

Each party creates ``<dir>/<name>.<party>`` and polls (every millisecond) until the files of all
``parties`` exist; files stay for the run, so a late poller still sees a passed barrier. A file
``abort`` ends every wait at once: a failing party writes it.
"""

from __future__ import annotations

import time
from pathlib import Path

from airflow_adrq_bench.errors import BenchError

_POLL_S = 0.001


class BarrierTimeoutError(BenchError):
    """Another benchmark process did not reach the barrier in time."""


def arrive(directory: Path, name: str, party: int) -> None:
    (directory / f"{name}.{party}").touch()


def abort(directory: Path) -> None:
    """Make every wait at every barrier in ``directory`` raise :class:`BarrierTimeoutError`."""
    (directory / "abort").touch()


def arrived(directory: Path, name: str, parties: int) -> int:
    """How many of parties ``0 .. parties-1`` have arrived at barrier ``name`` (aborted: an error)."""
    if (directory / "abort").exists():
        raise BarrierTimeoutError("another benchmark process failed")
    return sum(1 for p in range(parties) if (directory / f"{name}.{p}").exists())


def wait(directory: Path, name: str, party: int, parties: int, *, timeout_s: float) -> None:
    """Arrive at barrier ``name`` and return once all ``parties`` have."""
    arrive(directory, name, party)
    deadline = time.monotonic() + timeout_s
    missing = [p for p in range(parties) if p != party]
    while True:
        missing = [p for p in missing if not (directory / f"{name}.{p}").exists()]
        if not missing:
            return
        if (directory / "abort").exists():
            raise BarrierTimeoutError(f"barrier {name!r}: another benchmark process failed")
        if time.monotonic() > deadline:
            raise BarrierTimeoutError(
                f"barrier {name!r}: {parties - len(missing)} of {parties} processes after {timeout_s:.0f} s"
            )
        time.sleep(_POLL_S)
