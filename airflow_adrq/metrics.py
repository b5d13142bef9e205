"""What the queue write reports that an operator alerts on: a :class:`Metrics` the caller passes in.

The library reports to :data:`NOWHERE` unless given one; the plug-in passes one sending ``adrq.<name>``
to Airflow's ``Stats`` (README, "Metrics"). Passed along with the write, never installed process-wide.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NOWHERE", "Metrics", "Recorded"]


class Metrics(Protocol):
    """Where counters and timings go."""

    def incr(self, name: str, value: float = 1) -> None:
        """Add ``value`` to the counter ``name``."""

    def timing(self, name: str, ms: float) -> None:
        """Record ``ms`` milliseconds under the timer ``name``."""


class _Nowhere:
    def incr(self, name: str, value: float = 1) -> None:
        pass

    def timing(self, name: str, ms: float) -> None:
        pass


#: The default: nothing is sent.
NOWHERE: Metrics = _Nowhere()


class Recorded:
    """Keeps what it is sent, in order, as ``(kind, name, value)``: for tests, or a caller's own export."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []

    def incr(self, name: str, value: float = 1) -> None:
        self.sent.append(("incr", name, value))

    def timing(self, name: str, ms: float) -> None:
        self.sent.append(("timing", name, ms))

    def values(self, name: str) -> list[float]:
        """The values sent under ``name``, in order."""
        return [value for _, sent_name, value in self.sent if sent_name == name]
