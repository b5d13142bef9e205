"""The report as text (one screen, ending with the config line to set) and as JSON (every field)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

from airflow_adrq.doctor.report import ENABLE, NOT_NEEDED, NOT_SUPPORTED, Report, count

__all__ = ["CONFIG_LINE", "CONFIG_SECTION", "render_json", "render_text"]

CONFIG_SECTION = "[core]"
CONFIG_LINE = "asset_manager_class = airflow_adrq.airflow.AdrqAssetManager"
_ADVICE = {
    ENABLE: "Enable it, in airflow.cfg on every component that writes asset events:",
    NOT_NEEDED: "Nothing to do; it is safe to enable anyway with:",
    NOT_SUPPORTED: "Do not set (and remove, if set):",
}


def render_text(report: Report) -> str:
    """The report as text, about 25 lines of at most 100 characters."""
    c, e = report.compatibility, report.exposure
    lines = [f"airflow-adrq doctor: {report.url} (read-only)", "", "Compatibility"]

    def wrap(text: str, first: str, rest: str = "    ") -> None:
        lines.extend(textwrap.wrap(text, 100, initial_indent=first, subsequent_indent=rest))

    def row(label: str, value: str) -> None:
        wrap(value, f"  {label:<19} ", " " * 22)

    row("Airflow schema", f"{c.schema.airflow_version or 'unknown'} (alembic_version {c.schema.revision})")
    key = f"({', '.join(c.queue_key)})" if c.queue_key else "none"
    if c.shape_lines:
        key += f": as in Airflow {', '.join(c.shape_lines)}"
    elif c.shape:
        key += f": {c.shape}"
    row("Queue key", key)
    row("Plug-in", ("supported: " if c.supported else "NOT supported: ") + c.support)
    row("Server", c.server + (f", asset_dag_run_queue on {c.storage_engine}" if c.storage_engine else ""))
    if c.isolation:
        row("Isolation", c.isolation)
    if c.dag_id_collations:
        distinct = sorted(set(c.dag_id_collations.values()))
        each = "; ".join(f"{k} {v}" for k, v in c.dag_id_collations.items())
        row("dag_id collation", distinct[0] if len(distinct) == 1 else each)
    if (p := c.pgbouncer) is not None:
        if p.detected:
            mode = f"{p.pool_mode} pooling ({p.pool_mode_how})" if p.pool_mode else "pool mode unknown"
            row("PgBouncer", f"yes, {mode}; {p.how}")
        elif p.detected is None:
            row("PgBouncer", f"cannot tell: {p.how}")
        else:
            row("PgBouncer", p.how if p.how.startswith("no") else f"no: {p.how}")
    lines.append("Exposure")
    if e is None:
        lines.append("  n/a: the asset tables are missing")
    else:
        n = "{:,}".format
        over = ", ".join(f">{n(limit)}: {n(k)}" for limit, k in e.fanout_over.items())
        row(
            "Assets",
            f"{n(e.assets)} active, {n(e.assets_with_consumers)} with consumer DAGs "
            "(unpaused; direct, name, URI references)",
        )
        row(
            "Consumers/asset",
            f"max {n(e.fanout_max)}, p50 {n(e.fanout_p50)}, p99 {n(e.fanout_p99)}; assets with {over}",
        )
        row(
            "Several producers",
            f"{count(e.several_producers, 'asset')} ({n(e.several_producer_dags)} by several DAGs), "
            f"{n(e.racing)} of them with 2+ consumer DAGs: these race",
        )
        row(
            "Multi-outlet tasks",
            f"{n(e.multi_outlet_tasks)}; {n(e.multi_outlet_multirow)} queue 2+ rows "
            f"per success; {n(e.multi_outlet_shared)} share a consumer DAG between outlets",
        )
        row(
            "Aliases",
            f"{n(e.aliases)}; {n(e.alias_references)} DAG schedule references, "
            f"{n(e.alias_links)} asset links; {n(e.alias_multirow)} queue 2+ rows per event",
        )
        if e.deadlocks is not None:
            row("Deadlocks", f"{n(e.deadlocks)} ({e.deadlocks_scope})")
        # Only a backend with pg_stat_statements reports inserts, or why it has none.
        if e.queue_inserts:
            for i, q in enumerate(sorted(e.queue_inserts, key=lambda q: q.kind)):
                row("" if i else "Queue inserts", f"{q.kind}: {n(q.calls)} calls, mean {q.mean_ms:.2f} ms")
        elif e.queue_inserts_note is not None:
            row("Queue inserts", f"n/a: {e.queue_inserts_note}")
    for warning in report.warnings:
        wrap(warning, "  ! ")
    lines.append(f"Verdict: {report.verdict.upper()} (exit {report.exit_code})")
    for reason in report.reasons:
        wrap(reason, "  - ")
    lines.extend([f"  {_ADVICE[report.verdict]}", f"    {CONFIG_SECTION}", f"    {CONFIG_LINE}"])
    return "\n".join(lines)


def render_json(report: Report) -> str:
    """The report as JSON (every field of :class:`Report`, plus ``exit_code`` and the config line)."""
    config = {"section": "core", "option": "asset_manager_class", "value": CONFIG_LINE.split(" = ")[1]}
    data = {**dataclasses.asdict(report), "exit_code": report.exit_code, "config": config}
    return json.dumps(data, indent=2, default=str)
