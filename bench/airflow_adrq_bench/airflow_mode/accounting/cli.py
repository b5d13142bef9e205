"""``airflow-adrq bench --airflow --accounting``: options and ``main``."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import options
from airflow_adrq_bench.airflow_mode import run as run_module
from airflow_adrq_bench.airflow_mode.accounting.config import (
    _BACKENDS,
    _SIZE_HELP,
    DEFAULT,
    QUICK,
    AccountingSizes,
)
from airflow_adrq_bench.airflow_mode.accounting.controller import run
from airflow_adrq_bench.airflow_mode.accounting.report import format_tables

# --- command line -----------------------------------------------------------------


def build_parser(prog: str = "airflow-adrq bench --airflow --accounting") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Asset events that no run consumes, through Apache Airflow 3.3's own code: stock AssetManager "
            "vs airflow-adrq's plug-in as producers (TaskInstance.register_asset_changes_in_db), Airflow's "
            "scheduler method _create_dag_runs_asset_triggered as the consumer, on scratch databases made "
            "by `airflow db migrate`. Without --db: SQLite plus every PostgreSQL and MySQL/MariaDB server "
            "found (see airflow_adrq_bench.servers)."
        ),
    )
    options.add_routing_flags(parser, "--airflow", "--accounting")
    options.add_server_options(
        parser,
        db_help="measure on this server (repeatable): a scratch database is created there and dropped",
        backends=_BACKENDS,
    )
    parser.add_argument("--quick", action="store_true", help="smaller cells")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: bench-results/airflow-accounting-<UTC time>)",
    )
    options.add_size_options(
        parser.add_argument_group("sizes"),
        AccountingSizes,
        lambda name: (
            f"{_SIZE_HELP[name]} (default {options.show(getattr(DEFAULT, name))}, "
            f"--quick {options.show(getattr(QUICK, name))})"
        ),
    )
    return parser


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accounting mode; returns the exit status (1: a check failed or the plug-in lost more)."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    options.check_server_options(parser, args)
    if importlib.util.find_spec("airflow") is None:
        _say(
            "airflow-adrq bench --airflow --accounting: error: needs apache-airflow-core 3.3 in this "
            "environment (from a checkout: tox -e airflow-bench)"
        )
        return 1
    try:
        sizes = options.sizes_from(args, QUICK if args.quick else DEFAULT)
    except ValueError as exc:
        parser.error(str(exc))
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    out: Path = args.out or Path("bench-results") / f"airflow-accounting-{stamp}"
    try:
        with _targets(args) as targets:
            raw = run(targets, sizes, progress=_say)
    except (AdrqError, SQLAlchemyError) as exc:
        _say(f"airflow-adrq bench --airflow --accounting: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("airflow-adrq bench --airflow --accounting: interrupted (processes stopped, scratch dropped)")
        return 130
    text = format_tables(raw)
    out.mkdir(parents=True, exist_ok=True)
    (out / "airflow-accounting.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    (out / "airflow-accounting.md").write_text(text)
    print(text)
    print(f"wrote {out / 'airflow-accounting.json'}, {out / 'airflow-accounting.md'}")
    for problem in raw["problems"]:
        _say(f"ERROR: {problem}")
    return 1 if raw["problems"] else 0


@contextlib.contextmanager
def _targets(args: argparse.Namespace) -> Iterator[list[run_module.Target]]:
    with run_module.targets(args.db or [], args.backend, sqlite=True, say=_say) as targets:
        yield targets
