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

Per database, hold and manager (a cell, with an asset and consumer DAGs of its own): the consumer
passes while every producer commits its transactions; then it drains (passes until no queue row
of the cell is left); then one producer commits a sentinel event and the consumer drains again.
An event whose queue row already existed waits for the next run of its DAG: it is late, not
lost, and the sentinel's runs pick it up. Each (event, consumer DAG) pair is then consumed (by a
run before the sentinel), late (only by the sentinel's runs) or unconsumed (in no run's
consumed_asset_events). Checks (exit status 1 when one fails): the events are exactly the
committed transactions; every event is in one class; no run consumed another asset's event;
every consumer DAG consumed the sentinel; no queue row is left; the plug-in leaves no more
events unconsumed than stock at the same hold. The controller never imports Airflow.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from airflow_adrq_bench import options
from airflow_adrq_bench.airflow_mode import parser_for
from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.accounting.classify import PairClasses, classify
from airflow_adrq_bench.airflow_mode.accounting.config import (
    DEFAULT,
    MANAGERS,
    QUICK,
    AccountingError,
    AccountingSizes,
)
from airflow_adrq_bench.airflow_mode.accounting.controller import compare, run
from airflow_adrq_bench.airflow_mode.accounting.report import format_tables

__all__ = [
    "MANAGERS",
    "AccountingError",
    "AccountingSizes",
    "PairClasses",
    "build_parser",
    "classify",
    "compare",
    "format_tables",
    "main",
    "run",
]


def build_parser() -> argparse.ArgumentParser:
    """The options of the accounting mode; its description is the method (this docstring)."""
    parser = parser_for(__doc__ or "", "--accounting", ("--quick", "smaller cells"))
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, QUICK)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accounting mode; returns the exit status (1: a check failed or the plug-in lost more)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)
    return options.guarded(parser, args, lambda: _measure(args, sizes), airflow="apache-airflow-core 3.3")


def _measure(args: argparse.Namespace, sizes: AccountingSizes) -> int:
    out = options.out_dir(args)
    with run_module.targets(args.db or [], args.backend, sqlite=True) as targets:
        raw = run(targets, sizes, progress=options.say)
    out.mkdir(parents=True, exist_ok=True)
    (out / "airflow-accounting.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    written = [out / "airflow-accounting.json"]
    return options.publish(out / "airflow-accounting.md", format_tables(raw), written, raw["problems"])
