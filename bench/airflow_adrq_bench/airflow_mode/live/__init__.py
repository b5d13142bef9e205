"""``airflow-adrq bench --airflow --live``: a real Airflow deployment, stock vs the plug-in, side by side.

    airflow-adrq bench --airflow --live                         # every PostgreSQL / MariaDB server found
    airflow-adrq bench --airflow --live --backend mysql --producer-dags 4
    airflow-adrq bench --airflow --live --backend postgresql --schedulers 2 --pgbouncer --executor celery
    airflow-adrq bench --airflow --live --backend postgresql --pause-churn --reparse-s 2   # other dag writers

Per manager (stock: Airflow's AssetManager; plugin: airflow_adrq.airflow.AdrqAssetManager) and
database server, a deployment of the Airflow installed here on a scratch database made by `airflow
db migrate`: api-server, scheduler(s) and dag-processor on 127.0.0.1, with LocalExecutor or
CeleryExecutor workers on Redis, directly or through a throwaway PgBouncer. It writes producer
DAGs whose mapped instances finish together and consumer DAGs on their assets, triggers bursts
through the REST API, drains the queue, sends one more event per asset, drains again, and counts
on the database what every event became (with --pause-churn, REST pause/unpause and the bulk PATCH
/api/v2/dags run during the bursts, and on PostgreSQL a sampler records who each producer waited for:
:mod:`.churn`, :mod:`.lock_waits`). The deployments run one after another. SQLite is not
measured: Airflow does not support the LocalExecutor on it. Prints the verdict; the detail is in
live.md and live.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import airflow_adrq
from airflow_adrq_bench import exits, options, progress
from airflow_adrq_bench.airflow_mode import parser_for
from airflow_adrq_bench.airflow_mode.config import LIVE_DEFAULT as DEFAULT
from airflow_adrq_bench.airflow_mode.config import LIVE_SMALL as SMALL
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN as MANAGERS
from airflow_adrq_bench.airflow_mode.config import LiveShape, LiveSizes, default_time_limit
from airflow_adrq_bench.airflow_mode.databases import targets
from airflow_adrq_bench.airflow_mode.live import deployment, report
from airflow_adrq_bench.airflow_mode.live.driver import run_cell, steps
from airflow_adrq_bench.airflow_mode.report import conclude, raw_finish, raw_opening

_EPILOG = f"""\
A failed check (exit status 1): a deployment that did not complete (no deployment at all: 4), the
plug-in missing a target of correctness in the verdict (failed producer tasks, deadlocks, events lost
or consumed twice ...); with --check also its speed target missed (3: unclear); with
--expect-stock-worse also stock with neither failed tasks nor stranded pairs anywhere.

{exits.EPILOG}"""


def build_parser() -> argparse.ArgumentParser:
    """The options of the live mode."""
    small = ("--small", "the live test's size (the --small values below)")
    parser = parser_for(__doc__ or "", "--live", small)
    parser.epilog = _EPILOG
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (repeatable)")
    runs = "repeat the side-by-side K times (default 1)"
    parser.add_argument("--runs", type=_positive, default=1, help=runs)
    limit = f"default: sized to the run, {default_time_limit(DEFAULT):.0f} s at the default size"
    parser.add_argument("--time-limit", type=float, metavar="S", help=f"per deployment, in seconds ({limit})")
    keep = "keep the scratch databases and AIRFLOW_HOMEs (see live.json)"
    parser.add_argument("--keep-scratch", action="store_true", help=keep)
    kwargs = """[core] asset_manager_kwargs of the plug-in's deployments, e.g. '{"on_conflict": "refresh"}'"""
    parser.add_argument("--plugin-kwargs", metavar="JSON", type=_json_object, help=kwargs)
    parser.add_argument("--check", action="store_true", help="exit 1 also when the speed target is missed")
    parser.add_argument("--allow-unclear", action="store_true", help=exits.ALLOW_UNCLEAR_HELP)
    worse = "also fail unless stock had failed producer tasks or stranded pairs somewhere (for CI)"
    parser.add_argument("--expect-stock-worse", action="store_true", help=worse)
    shape = parser.add_argument_group("deployment shape (every manager gets the same)")
    options.add_fields(shape, LiveShape())
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, SMALL, "--small")
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return int(text)


def _json_object(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return text


def shape_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> LiveShape:
    """The shape the options give; exits with a usage error when they contradict each other."""
    if args.executor != "celery" and (args.celery_workers is not None or args.broker_url is not None):
        parser.error("--celery-workers and --broker-url need --executor celery")
    return options.sizes_from(parser, args, LiveShape())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the live mode; returns the exit status (see the parser's epilog)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    sizes = options.sizes_from(parser, args, SMALL if args.preset else DEFAULT)
    shape = shape_from(parser, args)
    needs = "apache-airflow 3.3 (the airflow command, task SDK, standard provider)"
    # SIGTERM ends the run like Ctrl-C does: the deployments are stopped, the scratch dropped.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return options.guarded(parser, args, lambda: _measure(args, sizes, shape), airflow=needs)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(args: argparse.Namespace, sizes: LiveSizes, shape: LiveShape) -> int:
    """Every (run, database, manager) deployment, one after the other, then the report and the verdict."""
    out = options.out_dir(args)
    managers = [m for m in MANAGERS if not args.manager or m in args.manager]
    limit, started = args.time_limit or default_time_limit(sizes), time.monotonic()
    with targets(args.db or [], args.backend, sqlite=False) as found:
        deployment.check(shape, found)  # before the first deployment: can this environment run the shape?
        raw: dict[str, Any] = {
            **raw_opening("airflow-adrq bench --airflow --live", sizes, managers),
            "airflow_version": metadata.version("apache-airflow-core"),
            "runs": args.runs,
            "time_limit_s": limit,
            "targets": [dataclasses.asdict(t) | {"server_url": None} for t in found],
            "plugin_source": _plugin_source(),
            "plugin_kwargs": args.plugin_kwargs,
            "cells": [],
        }
        cells = [(run, t, m) for run in range(1, args.runs + 1) for t in found for m in managers]
        with progress.task("live deployments", total=len(cells) * steps(sizes)) as bar:
            for run, target, manager in cells:
                bar.say(f"--- {target.version}: {manager}, run {run}/{args.runs} (limit {limit:.0f} s)")
                logs = out / "logs" / f"{target.name}-{manager}-run{run}"
                kwargs = args.plugin_kwargs if manager == "plugin" else None
                made = deployment.Deployment(target, manager, sizes, shape, logs, kwargs, args.keep_scratch)
                raw["cells"].append(run_cell(made, run, bar, limit))
    raw_finish(raw, started)
    lines, worse = report.verdict_lines(raw["cells"]), args.expect_stock_worse
    problems = report.problems(raw["cells"], lines, check=args.check, expect_stock_worse=worse)
    # The misses are in problems already (the speed target's with --check only): judged here, the unclear.
    unclear = [ln for ln in lines if ln.verdict == "unclear"]
    judged = exits.judge(problems, unclear, check=args.check, allow_unclear=args.allow_unclear)
    return conclude(out / "live", raw, report.format_tables(raw), lines, judged)


def _plugin_source() -> str:
    """Which airflow_adrq the plug-in deployments ran: the package's path, and in a git checkout its
    commit, ``-dirty`` with uncommitted changes (an editable install runs the working tree as it is)."""
    package = Path(airflow_adrq.__file__).resolve().parent
    describe = ["git", "-C", str(package), "describe", "--always", "--dirty"]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = subprocess.run(describe, capture_output=True, text=True, timeout=10, check=True)
        return f"{package} at {git.stdout.strip()}"
    return str(package)
