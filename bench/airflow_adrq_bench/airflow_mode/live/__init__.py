"""``airflow-adrq bench --airflow --live``: a real Airflow deployment, stock vs the plug-in, side by side.

    airflow-adrq bench --airflow --live                         # every PostgreSQL / MariaDB server found
    airflow-adrq bench --airflow --live --backend mysql --producer-dags 4
    airflow-adrq bench --airflow --live --backend postgresql --schedulers 2 --pgbouncer --executor celery

The command builds the deployments itself, on scratch databases, from the Airflow installed in
its own environment: per manager (stock: Airflow's AssetManager; plugin:
airflow_adrq.airflow.AdrqAssetManager) and backend, a database adrq_live_<manager>_<random> made
by `airflow db migrate`, and `airflow api-server`, `airflow scheduler` (one, or two in HA mode on
PostgreSQL) and `airflow dag-processor` on 127.0.0.1, with LocalExecutor, or CeleryExecutor and
`airflow celery worker` processes on a Redis broker, directly on the database or each through a
throwaway PgBouncer in transaction pooling mode (PostgreSQL only). It writes the DAG files
(producer DAGs with a mapped task whose instances finish together, each with the same outlet
assets; consumer DAGs on the OR of them), triggers the bursts through the REST API, waits for the
queue to drain, sends one more event per asset, drains again, and counts on the database what
every event became: failed / retried producer tasks, deadlocks, events written, consumer runs,
stranded and double-consumed (event, consumer) pairs, the queue left, trigger-to-done time and the
task-success call's latency. The deployments run one after another, each stopped before the next
starts. SQLite is not measured: Airflow does not support the LocalExecutor on it.
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
from types import FrameType
from typing import Any

import airflow_adrq
from airflow_adrq_bench import options
from airflow_adrq_bench.airflow_mode import parser_for
from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.config import raw_finish, raw_opening
from airflow_adrq_bench.airflow_mode.live import report, scaleout
from airflow_adrq_bench.airflow_mode.live.config import (
    DEFAULT,
    MANAGERS,
    SMALL,
    LiveShape,
    LiveSizes,
    default_time_limit,
)
from airflow_adrq_bench.airflow_mode.live.driver import run_cell

__all__ = ["build_parser", "main", "shape_from"]

_EPILOG = """\
Exit status 1 when a deployment did not complete, or the plug-in had a failed producer task, a
deadlock, a stranded or double-consumed pair, a wrong event count or queue rows left; with
--expect-stock-worse also when stock had neither failed tasks nor stranded pairs anywhere."""


def build_parser() -> argparse.ArgumentParser:
    """The options of the live mode."""
    parser = parser_for(
        __doc__ or "", "--live", ("--small", "the test suite's size (the --small values below)")
    )
    parser.epilog = _EPILOG
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (repeatable)")
    parser.add_argument("--runs", type=int, default=1, help="repeat the side-by-side K times (default 1)")
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="S",
        help="hard limit per deployment, in seconds (default: sized to the run, "
        f"{default_time_limit(DEFAULT):.0f} s at the default size)",
    )
    parser.add_argument(
        "--keep-scratch",
        action="store_true",
        help="keep the scratch databases and AIRFLOW_HOMEs (the paths are in live.json)",
    )
    parser.add_argument(
        "--plugin-kwargs",
        metavar="JSON",
        help='[core] asset_manager_kwargs of the plug-in\'s deployments, e.g. \'{"on_conflict": "refresh"}\' '
        "(default: none, the plug-in's own default)",
    )
    parser.add_argument(
        "--expect-stock-worse",
        action="store_true",
        help="also fail unless stock had failed producer tasks or stranded pairs somewhere (for CI)",
    )
    options.add_fields(
        parser.add_argument_group("deployment shape (every manager gets the same)"), LiveShape()
    )
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, SMALL, "--small")
    return parser


def shape_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> LiveShape:
    """The shape the options give; exits with a usage error when they contradict each other."""
    if args.executor != "celery" and (args.celery_workers is not None or args.broker_url is not None):
        parser.error("--celery-workers and --broker-url need --executor celery")
    return options.sizes_from(parser, args, LiveShape())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the live mode; returns the exit status (see the parser's epilog)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sizes = options.sizes_from(parser, args, SMALL if args.preset else DEFAULT)
    shape = shape_from(parser, args)
    if args.plugin_kwargs is not None:
        try:
            kwargs = json.loads(args.plugin_kwargs)
        except ValueError as exc:
            parser.error(f"--plugin-kwargs is not JSON: {exc}")
        if not isinstance(kwargs, dict):
            parser.error("--plugin-kwargs must be a JSON object")
    needs = "apache-airflow 3.3 (the airflow command, task SDK, standard provider)"
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return options.guarded(parser, args, lambda: _measure(args, sizes, shape), airflow=needs)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM ends the run like Ctrl-C does: the deployments are stopped, the scratch dropped."""
    raise KeyboardInterrupt(f"signal {signum}")


def _measure(args: argparse.Namespace, sizes: LiveSizes, shape: LiveShape) -> int:
    """Every (run, target, manager) deployment, one after the other, then the report."""
    out = options.out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    managers = [m for m in MANAGERS if not args.manager or m in args.manager]
    limit, started = args.time_limit or default_time_limit(sizes), time.monotonic()
    with run_module.targets(args.db or [], args.backend, sqlite=False) as targets:
        # Before the first deployment: whether this environment can run the shape at all.
        scaleout.check(shape, targets)
        raw: dict[str, Any] = {
            **raw_opening("airflow-adrq bench --airflow --live", sizes, managers),
            "airflow_version": _airflow_version(),
            "runs": args.runs,
            "time_limit_s": limit,
            "targets": [dataclasses.asdict(t) | {"server_url": None} for t in targets],
            "extra_events": "one per outlet asset, through POST /api/v2/assets/events",
            "plugin_source": _plugin_source(),
            "plugin_kwargs": args.plugin_kwargs,
            # The cells name each deployment's own (its schedulers, its broker database).
            "shape": dataclasses.asdict(shape)
            | {"broker_url": shape.broker_url and scaleout.redacted(shape.broker_url)},
            "cells": [],
        }
        for run_index in range(args.runs):
            for target in targets:
                for manager in managers:
                    run_name = f"run {run_index + 1}/{args.runs}"
                    options.say(f"--- {target.version}: {manager}, {run_name} (limit {limit:.0f} s)")
                    raw["cells"].append(
                        run_cell(
                            target,
                            manager,
                            run_index,
                            sizes,
                            out=out,
                            time_limit_s=limit,
                            keep_scratch=args.keep_scratch,
                            manager_kwargs=args.plugin_kwargs if manager == "plugin" else None,
                            shape=shape,
                            say=options.say,
                        )
                    )
    raw_finish(raw, started, ndigits=1)
    raw["problems"] = report.problems(raw["cells"], expect_stock_worse=args.expect_stock_worse)
    raw["notes"] = report.notes(raw["cells"])
    report.write_json(raw, out / "live.json")
    png = report.plot(raw, out / "live.png")
    written = [out / "live.json", *([png] if png else [])]
    return options.publish(
        out / "live.md", report.format_tables(raw), written, raw["problems"], notes=raw["notes"]
    )


def _airflow_version() -> str:
    """The installed Airflow's version, read from its package metadata (Airflow is not imported)."""
    for name in ("apache-airflow-core", "apache-airflow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "?"


def _plugin_source() -> dict[str, Any]:
    """Which airflow_adrq the plug-in deployments ran: the package's path, and in a git checkout its
    commit and uncommitted changes (an editable install runs the working tree as it is)."""
    package = Path(airflow_adrq.__file__).resolve().parent
    info: dict[str, Any] = {"path": str(package)}

    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(package), *argv], capture_output=True, text=True, timeout=10)

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return info
    if head.returncode == 0:
        info["commit"] = head.stdout.strip()
        info["uncommitted"] = [line[3:] for line in dirty.stdout.splitlines() if line.strip()]
    return info
