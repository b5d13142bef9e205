"""Where the queue write reports what an operator alerts on: ``report(kind, name, value)``.

``kind`` is ``"timing"`` (ms) or ``"incr"``. By default nowhere; the plug-in
replaces :func:`report` with one sending ``adrq.<name>`` to Airflow's ``Stats``
(README, "Metrics"). A module of its own, below every writer, so that each
reads the one hook in force.
"""

from __future__ import annotations

__all__ = ["report"]


def report(kind: str, name: str, value: float) -> None:
    """Nowhere: replaced by the plug-in (:mod:`airflow_adrq.airflow.manager`)."""
