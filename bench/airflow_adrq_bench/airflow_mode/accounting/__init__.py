"""``airflow-adrq bench --airflow --accounting``: asset events that no run consumes, through Airflow itself.

    airflow-adrq bench --airflow --accounting                # SQLite + every PostgreSQL/MariaDB server found
    airflow-adrq bench --airflow --accounting --db postgresql://root@127.0.0.1/postgres

The library benchmark's lost_events scenario applies a copy of Airflow 3.3.2's scheduler rule;
this mode measures the same with Airflow's own code on both sides. Producers: the Airflow mode's
worker processes, each bound to one asset manager through [core] asset_manager_class (stock:
Airflow's AssetManager; plugin: airflow_adrq.airflow.AdrqAssetManager), run task-success
transactions through TaskInstance.register_asset_changes_in_db with one outlet, hold them open
(the rest of task success) and COMMIT. Consumer: one more Airflow process running the scheduler's
own SchedulerJobRunner._create_dagruns_for_dags pass after pass while the producers run (runs are
created QUEUED, nothing executes), on real serialized DAGs scheduled on the cell's asset.

Per database, hold and manager (a cell, with an asset and consumer DAGs of its own; with --fan-in
also cells where each producer emits an asset of its own and one DAG is scheduled on any of them:
the race between producers of different assets through DagModel.dags_needing_dagruns): the consumer
passes while every producer commits its transactions; then it drains (passes until no queue row
of the cell is left); then one producer commits a sentinel event and the consumer drains again.
An event whose queue row already existed waits for the next run of its DAG: it is late, not
lost, and the sentinel's runs pick it up. Each (event, consumer DAG) pair is then consumed (by a
run before the sentinel), late (only by the sentinel's runs) or unconsumed (in no run's
consumed_asset_events). Checks (exit status 1 when one fails): the events are exactly the
committed transactions; every event is in one class; no run consumed another asset's event;
every consumer DAG consumed the sentinel; no queue row is left; the plug-in leaves no more
events unconsumed than stock in the same cell, and consumes no pair twice (the verdict). The
controller never imports Airflow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from airflow_adrq_bench import options, tables
from airflow_adrq_bench.airflow_mode import parser_for
from airflow_adrq_bench.airflow_mode.accounting.controller import run, verdict
from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_DEFAULT as DEFAULT
from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_QUICK as QUICK
from airflow_adrq_bench.airflow_mode.config import AccountingSizes
from airflow_adrq_bench.airflow_mode.databases import targets
from airflow_adrq_bench.airflow_mode.results import conclude, heading
from airflow_adrq_bench.verdict import missed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accounting mode; returns the exit status (1: a check failed or the plug-in lost more)."""
    parser = parser_for(__doc__ or "", "--accounting", ("--quick", "smaller cells"))
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, QUICK)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)
    return options.guarded(parser, args, lambda: _measure(args, sizes), airflow="apache-airflow-core 3.3")


def _measure(args: argparse.Namespace, sizes: AccountingSizes) -> int:
    out = options.out_dir(args)
    with targets(args.db or [], args.backend, sqlite=True) as found:
        raw = run(found, sizes)
    lines = verdict(raw["cells"])
    problems = raw["problems"] + [f"{m.db} {m.what}: {m.measured}" for m in missed(lines)]
    return conclude(out / "airflow-accounting", raw, format_tables(raw), lines, problems)


_COLUMNS: tables.Columns = {
    "database": "db",
    "hold": lambda c: f"{c['hold_ms']:g} ms",
    "shape": "shape",
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
    """The accounting table (Markdown) with its legend and each cell's problems."""
    sizes = raw["sizes"]
    versions = ", ".join(f"{t['name']}: {t['version']}" for t in raw["targets"])
    lines = [
        heading("Event accounting, stock AssetManager vs airflow-adrq's plug-in", raw),
        "",
        f"{sizes['producers']} producers per manager x {sizes['transactions']} transactions, "
        f"{sizes['consumers']} consumer DAGs, consumer pass every {sizes['consumer_pause_ms']:g} ms; "
        f"databases: {versions}.",
        "",
        tables.table(raw["cells"], _COLUMNS, left=4),
        "",
        tables.legend("accounting"),
    ]
    if raw["problems"]:
        lines += ["", "Problems:", *[f"* {p}" for p in raw["problems"]]]
    return "\n".join(lines)
