"""The verdict: enable, not needed, or not supported, with the reasons.

Enable when a transaction can write two queue rows that another locks in
the other order (racing producers, multi-outlet tasks, assets with several
consumers, alias events); not needed when none writes two, the queue is
keyed by event, or the backend runs one writer at a time.
"""

from __future__ import annotations

from airflow_adrq.doctor import backends
from airflow_adrq.doctor.report import (
    ENABLE,
    FANOUT_THRESHOLDS,
    NOT_NEEDED,
    NOT_SUPPORTED,
    Compatibility,
    Exposure,
    count,
)

__all__ = ["decide"]


def decide(compatibility: Compatibility, exposure: Exposure | None) -> tuple[str, list[str]]:
    """``(verdict, reasons)``; ``exposure`` is ``None`` only for a schema that is not supported."""
    if not compatibility.supported:
        return NOT_SUPPORTED, [compatibility.support]
    probe = backends.get(compatibility.backend)
    if probe.cannot_deadlock:
        return NOT_NEEDED, [probe.cannot_deadlock]
    if set(compatibility.queue_key or ()) == {"target_dag_id", "asset_event_id"}:
        reason = (
            "this queue is keyed by (target_dag_id, asset_event_id): concurrent producers insert different "
            "rows and cannot deadlock on them"
        )
        if exposure is not None and exposure.fanout_max > FANOUT_THRESHOLDS[0]:
            reason += (
                "; the plug-in still saves loading every consumer DAG per event "
                f"(up to {exposure.fanout_max:,} here)"
            )
        return NOT_NEEDED, [reason]
    assert exposure is not None
    reasons = []
    if exposure.racing:
        reasons.append(
            f"{count(exposure.racing, 'asset')} with 2+ consumer DAGs produced by several tasks: two "
            "producers lock the same queue rows in Python set order, which differs between processes"
        )
    if exposure.multi_outlet_shared:
        reasons.append(
            f"{count(exposure.multi_outlet_shared, 'task')} with several outlets sharing a consumer DAG: "
            "two runs lock (A, dag) and (B, dag) in opposite orders"
        )
    if exposure.multi_consumer_assets and not exposure.racing:
        reasons.append(
            f"{count(exposure.multi_consumer_assets, 'asset')} with 2+ consumer DAGs (max "
            f"{exposure.fanout_max:,}): events for one of them racing each other (several runs, mapped "
            "tasks, the REST API) lock its queue rows in different orders"
        )
    if exposure.multi_outlet_multirow and not reasons:
        reasons.append(
            f"{count(exposure.multi_outlet_multirow, 'task')} with several outlets queueing 2+ rows per "
            "success: two runs lock them in different orders"
        )
    if exposure.alias_multirow:
        reasons.append(f"{count(exposure.alias_multirow, 'alias', 'aliases')} queueing 2+ rows per event")
    if not reasons:
        if not exposure.assets_with_consumers and not exposure.alias_references:
            return NOT_NEEDED, ["no unpaused DAG is scheduled on an asset: nothing is queued"]
        return NOT_NEEDED, [
            "no transaction can write two queue rows: every asset has at most one consumer DAG, no task's "
            "outlets reach two, and no alias event queues two"
        ]
    if exposure.deadlocks and probe.deadlock_counter:
        reasons.append(
            f"{probe.deadlock_counter} has counted {count(exposure.deadlocks, 'deadlock')} "
            f"({exposure.deadlocks_scope})"
        )
    return ENABLE, reasons
