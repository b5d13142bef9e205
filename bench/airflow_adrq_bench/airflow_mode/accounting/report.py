"""The tables of ``--accounting``."""

from __future__ import annotations

import math
from typing import Any

# --- report ------------------------------------------------------------------------------

_LEGEND = """\
Legend: each row is one cell: `producers` processes of one asset manager, each committing
`transactions` task-success transactions (one outlet, held open `hold` ms before COMMIT) through
Airflow's TaskInstance.register_asset_changes_in_db, while Airflow's own scheduler method
(SchedulerJobRunner._create_dagruns_for_dags -> _create_dag_runs_asset_triggered) creates runs of the
asset's consumer DAGs. events: committed events (= committed transactions); consumed: every consumer
DAG consumed the event in a run created during the round or its drain; late: consumed, by some DAG only
in the run a sentinel event triggered afterwards (its queue row already existed, so it waited for the
next run); unconsumed: some consumer DAG's runs never consumed it (in no row of dagrun_asset_event
for that DAG); in no run: consumed by no DAG at all. pairs c/l/u: the same per (event, consumer DAG).
dup: pairs consumed by two runs of the same DAG. runs: asset-triggered runs created (QUEUED), of which
the sentinel's. errors p/c: retryable database errors (deadlocks ...) of the producers (each replays
its transaction) / of the consumer (Airflow's @retry_db_transaction retries its pass)."""


def format_tables(raw: dict[str, Any]) -> str:
    """The accounting table (Markdown) with its legend and the comparison."""
    sizes = raw["sizes"]
    lines = [
        "## Event accounting through Apache Airflow "
        f"{raw.get('airflow_version', '?')}: stock AssetManager vs airflow-adrq's plug-in",
        "",
        f"{sizes['producers']} producers per manager x {sizes['transactions']} transactions, "
        f"{sizes['consumers']} consumer DAGs, consumer pass every {sizes['consumer_pause_ms']:g} ms; "
        f"{raw.get('cpus')} CPUs, load average {_load(raw)}.",
        "",
        "| database | hold | manager | events | consumed | late | unconsumed | in no run "
        "| pairs c/l/u | dup | runs (sentinel) | errors p/c | round s |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---:|",
    ]
    for c in raw["cells"]:
        errors = f"{sum(c['producer_failures'].values())}/{sum(c['consumer_db_errors'].values())}"
        lines.append(
            f"| {c['db']} | {c['hold_ms']:g} ms | {c['manager']} | {c['events']} | {c['consumed']} | "
            f"{c['late']} | **{c['unconsumed']}** | {c['in_no_run']} | "
            f"{c['consumed_pairs']}/{c['late_pairs']}/{c['unconsumed_pairs']} | {c['duplicate_pairs']} | "
            f"{c['runs']} ({c['runs'] - c['runs_before_sentinel']}) | {errors} | {c['duration_s']:.1f} |"
        )
    lines += ["", _LEGEND, ""]
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


def _load(raw: dict[str, Any]) -> str:
    load = raw.get("load_average", {})
    parts = [f"{k} {v[0]:.2f}" for k, v in load.items() if v]
    return ", ".join(parts) or "?"
