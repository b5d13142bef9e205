"""The tables of ``--accounting``."""

from __future__ import annotations

import math
from typing import Any

from airflow_adrq_bench import tables

__all__ = ["format_tables"]

_COLUMNS: tables.Columns = {
    "database": "db",
    "hold": lambda c: f"{c['hold_ms']:g} ms",
    "manager": "manager",
    "events": "events",
    "consumed": "consumed",
    "late": "late",
    "unconsumed": lambda c: f"**{c['unconsumed']}**",
    "in no run": "in_no_run",
    "pairs c/l/u": lambda c: f"{c['consumed_pairs']}/{c['late_pairs']}/{c['unconsumed_pairs']}",
    "dup": "duplicate_pairs",
    "runs (sentinel)": lambda c: f"{c['runs']} ({c['runs'] - c['runs_before_sentinel']})",
    "errors p/c": lambda c: f"{sum(c['producer_failures'].values())}/{sum(c['consumer_db_errors'].values())}",
    "round s": lambda c: f"{c['duration_s']:.1f}",
}


def format_tables(raw: dict[str, Any]) -> str:
    """The accounting table (Markdown) with its legend and the comparison."""
    sizes = raw["sizes"]
    loads = ", ".join(f"{k} {v[0]:.2f}" for k, v in raw.get("load_average", {}).items() if v) or "?"
    lines = [
        "## Event accounting through Apache Airflow "
        f"{raw.get('airflow_version', '?')}: stock AssetManager vs airflow-adrq's plug-in",
        "",
        f"{sizes['producers']} producers per manager x {sizes['transactions']} transactions, "
        f"{sizes['consumers']} consumer DAGs, consumer pass every {sizes['consumer_pause_ms']:g} ms; "
        f"{raw.get('cpus')} CPUs, load average {loads}.",
        "",
        tables.table(raw["cells"], _COLUMNS, left=3),
        "",
        tables.legend("accounting"),
    ]
    for row in raw.get("comparison", []):
        verdict = "fewer" if row["plugin_unconsumed"] < row["stock_unconsumed"] else "not more"
        if row.get("problem"):
            verdict = "MORE"
        lines.append(
            f"* {row['db']}, hold {row['hold_ms']:g} ms: unconsumed events stock {row['stock_unconsumed']}, "
            f"plug-in {row['plugin_unconsumed']} ({verdict}); pairs {row['stock_unconsumed_pairs']} vs "
            f"{row['plugin_unconsumed_pairs']}"
        )
    versions = ", ".join(f"{t['name']}: {t['version']}" for t in raw["targets"])
    lines += ["", f"Databases: {versions}. Took {raw.get('duration_s', math.nan):.0f} s."]
    if raw["problems"]:
        lines += ["", "Problems:", *[f"* {p}" for p in raw["problems"]]]
    return "\n".join(lines) + "\n"
