"""A file barrier: the benchmark's processes start and end every round together.

The parties are pytest-xdist workers, interpreters that share no memory and no parent's
``multiprocessing`` handle, so the barrier is files: each party creates ``<dir>/<name>.<party>``
and polls (by default every millisecond) until the files of all ``parties`` exist. Files stay
for the run, so a late poller still sees a passed barrier, and the runner reads progress from
them. A file ``abort`` ends every wait at once: a failing party writes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from airflow_adrq_bench.errors import BenchError


class BarrierTimeoutError(BenchError):
    """Another benchmark process did not reach the barrier in time."""


def arrive(directory: Path, name: str, party: int) -> None:
    (directory / f"{name}.{party}").touch()


def arrived(directory: Path, name: str, party: int) -> bool:
    return (directory / f"{name}.{party}").exists()


def abort(directory: Path) -> None:
    """Make every wait at every barrier in ``directory`` raise :class:`BarrierTimeoutError`."""
    (directory / "abort").touch()


def wait(
    directory: Path,
    name: str,
    party: int,
    parties: int,
    *,
    timeout_s: float,
    between: Callable[[], object] = lambda: None,
    pause_s: float = 0.001,
) -> None:
    """Arrive at barrier ``name`` and return once all ``parties`` have; ``between()`` (the
    coordinator's consumer step) runs before each pause."""
    arrive(directory, name, party)
    deadline = time.monotonic() + timeout_s
    missing = [p for p in range(parties) if p != party]
    while missing := [p for p in missing if not arrived(directory, name, p)]:
        if (directory / "abort").exists():
            raise BarrierTimeoutError(f"barrier {name!r}: another benchmark process failed")
        if time.monotonic() > deadline:
            raise BarrierTimeoutError(
                f"barrier {name!r}: {parties - len(missing)} of {parties} processes after {timeout_s:.0f} s"
            )
        between()
        time.sleep(pause_s)
