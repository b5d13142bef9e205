"""``airflow-adrq bench --airflow --live``: a real Airflow deployment, stock vs the plug-in, side by side.

::

    airflow-adrq bench --airflow --live                         # every PostgreSQL / MariaDB server found
    airflow-adrq bench --airflow --live --backend mysql --producer-dags 4
    airflow-adrq bench --airflow --live --db postgresql://root@127.0.0.1/postgres --schedulers 2
    airflow-adrq bench --airflow --live --backend postgresql --schedulers 2 --pgbouncer --executor celery

The command builds the deployment itself, on scratch databases, from the
Airflow installed in its own environment: per manager (``stock``: Airflow's
``AssetManager``; ``plugin``: ``airflow_adrq.airflow.AdrqAssetManager``) and
backend, a database ``adrq_live_<manager>_<random>`` made by ``airflow db
migrate``, and ``airflow api-server``, ``airflow scheduler --skip-serve-logs``
(one, or two in HA mode on PostgreSQL) and ``airflow dag-processor`` as child
processes on ``127.0.0.1``, with LocalExecutor, or CeleryExecutor and ``airflow
celery worker`` processes on a Redis broker (``--executor celery``), directly
on the database or each through a throwaway PgBouncer in transaction pooling
mode (``--pgbouncer``, PostgreSQL only). It writes the DAG files (producer
DAGs with a mapped task whose instances finish together, each with the same
outlet assets; consumer DAGs on the OR of them), warms the api-server up,
triggers the bursts through the REST API, waits for the queue to drain, sends
one more event per asset, drains again, and counts on the database what every
event became. The deployments run one after another (stock, then plug-in, per
backend and run), each stopped before the next starts.

Modules: :mod:`.config` (sizes, shape, names, limits), :mod:`.dags` (the DAG files),
:mod:`.deployment` (settings, components, stopping them), :mod:`.scaleout`
(the Celery and PgBouncer checks, the PgBouncer, the broker), :mod:`.driver`
(REST calls, waits, progress), :mod:`.measure` (SQL counts, deadlock
counters, log parsing), :mod:`.runner` (one deployment end to end),
:mod:`.report` (table, JSON, PNG, exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib.util
import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import options, servers
from airflow_adrq_bench.airflow_mode import rawinfo
from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.live import report, scaleout
from airflow_adrq_bench.airflow_mode.live.config import (
    DEFAULT,
    EXECUTORS,
    MANAGERS,
    SMALL,
    LiveShape,
    LiveSizes,
    default_time_limit,
)
from airflow_adrq_bench.airflow_mode.live.deployment import airflow_command
from airflow_adrq_bench.airflow_mode.live.runner import run_cell

__all__ = ["build_parser", "main", "run", "shape_from"]

_PROG = "airflow-adrq bench --airflow --live"

_SIZE_HELP = {
    "instances": "mapped instances of each producer DAG's task (N)",
    "outlets": "outlet assets of every producer instance, a0, a1 ... (shared by all producer DAGs)",
    "consumers": "consumer DAGs (F), each scheduled on a0 | a1 | ...",
    "bursts": "bursts: every producer DAG triggered once, then waited for",
    "producer_dags": "producer DAGs (several are needed for stock to deadlock on MySQL/MariaDB)",
    "schedulers": "schedulers: 2 runs Airflow's HA mode (PostgreSQL only; MySQL/MariaDB get 1)",
    "retries": "retries of the producer task",
    "settle_s": "seconds without queue rows and new consumer runs that count as drained",
    "drain_timeout_s": "longest wait for a drain (the queue left is then reported)",
    "barrier_timeout_s": "seconds a producer instance waits for the rest of its burst (0: sized to it)",
    "lead_s": "seconds from the last instance's arrival to the common finish",
    "spread_s": "each instance finishes a random 0 to this many seconds after the common finish",
}


def build_parser(prog: str = _PROG) -> argparse.ArgumentParser:
    """The options of the live mode."""
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "A real Apache Airflow deployment (the Airflow installed here: api-server, scheduler(s), "
            "dag-processor, LocalExecutor or CeleryExecutor and its workers, optionally PgBouncer, on "
            "127.0.0.1) built on scratch databases, once per asset "
            "manager: stock AssetManager and airflow-adrq's plug-in side by side. Bursts of mapped "
            "producer tasks finishing together; per manager: failed / retried producer tasks, deadlocks, "
            "events written, consumer runs, stranded and double-consumed (event, consumer) pairs, the "
            "queue left, trigger-to-done time and the task-success call's latency. Without --db: every "
            "PostgreSQL and MySQL/MariaDB server found (airflow_adrq_bench.servers). SQLite is not measured: "
            "Airflow does not support the LocalExecutor on SQLite."
        ),
        epilog=(
            "Exit status 1 when a deployment did not complete, or the plug-in had a failed producer "
            "task, a deadlock, a stranded or double-consumed pair, a wrong event count or queue rows "
            "left; with --expect-stock-worse also when stock had neither failed tasks nor stranded "
            "pairs anywhere."
        ),
    )
    options.add_routing_flags(parser, "--airflow", "--live")
    options.add_server_options(
        parser,
        db_help="use this server (repeatable): scratch databases are created on it and dropped; refused if "
        "the URL's own database has Airflow tables",
        backends=servers.BACKENDS,
        backend_help="without --db: only these (repeatable; default: every server found)",
    )
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (repeatable)")
    parser.add_argument("--runs", type=int, default=1, help="repeat the side-by-side K times (default 1)")
    parser.add_argument(
        "--small",
        action="store_true",
        help=f"the test suite's size: {SMALL.instances} instances x {SMALL.outlets} outlets, "
        f"{SMALL.consumers} consumers, {SMALL.bursts} bursts, {SMALL.producer_dags} producer DAGs",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="hard limit per deployment, in seconds (default: sized to the run, "
        f"{default_time_limit(DEFAULT):.0f} s at the default size)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: bench-results/airflow-live-<UTC>)"
    )
    parser.add_argument(
        "--keep-scratch",
        action="store_true",
        help="keep the scratch databases and AIRFLOW_HOMEs (the paths are in live.json)",
    )
    parser.add_argument(
        "--plugin-kwargs",
        metavar="JSON",
        default=None,
        help='[core] asset_manager_kwargs of the plug-in\'s deployments, e.g. \'{"on_conflict": "refresh"}\' '
        "(default: none, the plug-in's own default)",
    )
    parser.add_argument(
        "--expect-stock-worse",
        action="store_true",
        help="also fail unless stock had failed producer tasks or stranded pairs somewhere (for CI)",
    )
    _add_shape_options(parser.add_argument_group("deployment shape (every manager gets the same)"))
    options.add_size_options(
        parser.add_argument_group("sizes"),
        LiveSizes,
        lambda name: f"{_SIZE_HELP[name]} (default {getattr(DEFAULT, name)!r})",
    )
    return parser


def _add_shape_options(group: argparse._ActionsContainer) -> None:
    """The options of :class:`LiveShape` (``--schedulers`` is a size: it is among the sizes)."""
    default = LiveShape()
    group.add_argument(
        "--executor",
        choices=EXECUTORS,
        default=default.executor,
        help="local: LocalExecutor; celery: CeleryExecutor with --celery-workers `airflow celery worker` "
        f"processes, results in the scratch database (needs: {scaleout.CELERY_INSTALL}) "
        f"(default {default.executor})",
    )
    group.add_argument(
        "--celery-workers",
        type=int,
        default=None,
        metavar="N",
        help=f"Celery workers, each running a share of a burst at once (default {default.celery_workers})",
    )
    group.add_argument(
        "--broker-url",
        default=None,
        metavar="URL",
        help=f"the Celery broker (default: the Redis at {scaleout.DEFAULT_REDIS}, a database number "
        "per deployment; every deployment has a queue of its own)",
    )
    group.add_argument(
        "--pgbouncer",
        action="store_true",
        help="every component (api-server, schedulers, dag-processor, Celery workers) reaches PostgreSQL "
        "through a throwaway PgBouncer in transaction pooling mode, one per deployment (Debian package "
        "pgbouncer; PostgreSQL only); airflow db migrate goes directly",
    )
    group.add_argument(
        "--api-workers",
        type=int,
        default=None,
        metavar="N",
        help=f"[api] workers of the api-server (default {default.api_workers})",
    )


def shape_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> LiveShape:
    """The shape the options give; exits with a usage error when they contradict each other."""
    if args.executor != "celery" and (args.celery_workers is not None or args.broker_url is not None):
        parser.error("--celery-workers and --broker-url need --executor celery")
    given = {
        name: getattr(args, name)
        for name in ("celery_workers", "broker_url", "api_workers")
        if getattr(args, name) is not None
    }
    try:
        return LiveShape(executor=args.executor, pgbouncer=args.pgbouncer, **given)
    except ValueError as exc:
        parser.error(str(exc))


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _missing_requirements() -> list[str]:
    missing = []
    if not Path(airflow_command()[0]).exists() or importlib.util.find_spec("airflow") is None:
        missing.append("apache-airflow 3.3 (the airflow command, task SDK, standard provider)")
    if importlib.util.find_spec("matplotlib") is None:
        missing.append("matplotlib")
    return missing


@contextlib.contextmanager
def _targets(args: argparse.Namespace) -> Iterator[list[run_module.Target]]:
    """The servers to measure on: ``--db`` URLs (refused if they hold Airflow tables) or the servers found."""
    with run_module.targets(args.db or [], args.backend, sqlite=False, say=_say) as targets:
        yield targets


def run(
    targets: Sequence[run_module.Target],
    sizes: LiveSizes,
    *,
    managers: Sequence[str] = MANAGERS,
    runs: int = 1,
    out: Path,
    time_limit_s: float | None = None,
    keep_scratch: bool = False,
    plugin_kwargs: str | None = None,
    shape: LiveShape | None = None,
) -> dict[str, Any]:
    """Every (run, target, manager) deployment, one after the other; returns the raw results.

    Raises :class:`~.config.LiveError` before the first deployment when this
    environment cannot run ``shape`` (:func:`.scaleout.check`).
    """
    shape = shape or LiveShape()
    scaleout.check(shape, targets)
    limit = time_limit_s or default_time_limit(sizes)
    started = time.monotonic()
    raw: dict[str, Any] = {
        **rawinfo.opening(_PROG, sizes, managers),
        "airflow_version": _airflow_version(),
        "runs": runs,
        "time_limit_s": limit,
        "targets": [dataclasses.asdict(t) | {"server_url": None} for t in targets],
        "extra_events": "one per outlet asset, through POST /api/v2/assets/events",
        "plugin_source": _plugin_source(),
        "plugin_kwargs": plugin_kwargs,
        # The cells name each deployment's own (its schedulers, its broker database).
        "shape": dataclasses.asdict(shape)
        | {"broker_url": shape.broker_url and scaleout.redacted(shape.broker_url)},
        "cells": [],
    }
    for run_index in range(runs):
        for target in targets:
            for manager in managers:
                _say(f"--- {target.version}: {manager}, run {run_index + 1}/{runs} (limit {limit:.0f} s)")
                raw["cells"].append(
                    run_cell(
                        target,
                        manager,
                        run_index,
                        sizes,
                        out=out,
                        time_limit_s=limit,
                        keep_scratch=keep_scratch,
                        manager_kwargs=plugin_kwargs if manager == "plugin" else None,
                        shape=shape,
                        say=_say,
                    )
                )
    rawinfo.finish(raw, started, ndigits=1)
    return raw


def _airflow_version() -> str:
    """The installed Airflow's version, read from its package metadata (Airflow is not imported)."""
    from importlib import metadata

    for name in ("apache-airflow-core", "apache-airflow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return "?"


def _plugin_source() -> dict[str, Any]:
    """Which airflow_adrq the plug-in deployments ran: the package's path, and in a git checkout
    its commit and uncommitted changes (an editable install runs the working tree as it is)."""
    import subprocess

    import airflow_adrq

    package = Path(airflow_adrq.__file__).resolve().parent
    info: dict[str, Any] = {"path": str(package)}
    try:
        head = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return info
    if head.returncode == 0:
        info["commit"] = head.stdout.strip()
        info["uncommitted"] = [line[3:] for line in dirty.stdout.splitlines() if line.strip()]
    return info


def _terminate(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM ends the run like Ctrl-C does: the deployments are stopped, the scratch dropped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the live mode; returns the exit status (see the parser's epilog)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    options.check_server_options(parser, args)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        sizes = options.sizes_from(args, SMALL if args.small else DEFAULT)
    except ValueError as exc:
        parser.error(str(exc))
    shape = shape_from(parser, args)
    if args.plugin_kwargs is not None:
        try:
            kwargs = json.loads(args.plugin_kwargs)
        except ValueError as exc:
            parser.error(f"--plugin-kwargs is not JSON: {exc}")
        if not isinstance(kwargs, dict):
            parser.error("--plugin-kwargs must be a JSON object")
    missing = _missing_requirements()
    if missing:
        _say(f"{_PROG}: error: needs {', '.join(missing)} in this environment")
        return 1
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    out: Path = args.out or Path("bench-results") / f"airflow-live-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    managers = [m for m in MANAGERS if not args.manager or m in args.manager]
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with _targets(args) as targets:
            raw = run(
                targets,
                sizes,
                managers=managers,
                runs=args.runs,
                out=out,
                time_limit_s=args.time_limit,
                keep_scratch=args.keep_scratch,
                plugin_kwargs=args.plugin_kwargs,
                shape=shape,
            )
    except (AdrqError, SQLAlchemyError) as exc:
        _say(f"{_PROG}: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _say(f"{_PROG}: interrupted (every component stopped, scratch databases dropped)")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    raw["problems"] = report.problems(raw["cells"], expect_stock_worse=args.expect_stock_worse)
    raw["notes"] = report.notes(raw["cells"])
    text = report.format_tables(raw)
    report.write_json(raw, out / "live.json")
    (out / "live.md").write_text(text)
    png = report.plot(raw, out / "live.png")
    print(text)
    print(f"wrote {out / 'live.json'}, {out / 'live.md'}" + (f", {png}" if png else ""))
    for note in raw["notes"]:
        _say(f"note: {note}")
    for problem in raw["problems"]:
        _say(f"ERROR: {problem}")
    return 1 if raw["problems"] else 0
