"""``airflow-adrq bench``: :func:`main`, the ``airflow_adrq.commands`` entry point (:mod:`airflow_adrq.cli`).

::

    airflow-adrq bench                 # SQLite + every PostgreSQL/MariaDB server found or started
    airflow-adrq bench --quick         # the same, small: about 1-2 minutes for all three
    airflow-adrq bench --db postgresql://user@host/db --db mysql://user@host/db

The benchmark connects to the database a URL names (it must exist) only to
create a scratch database ``adrq_bench_<random>`` next to it on the same
server, and drops that afterwards; nothing is written to the named database.
For SQLite the scratch database is a temporary file, whatever the URL names.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.cli import one_line
from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import modes, options, report, runner, servers
from airflow_adrq_bench.config import (
    DEFAULT,
    DEFAULT_STRATEGY,
    QUICK,
    SCENARIOS,
    SIZE_HELP,
    STRATEGIES,
    Sizes,
    clear_of_deadlock_timeout,
)

__all__ = ["add_bench_parser", "main"]


DB_HELP = (
    "benchmark this server (repeatable). The database the URL names must exist and is never written "
    "to: the benchmark connects to it to create a scratch database adrq_bench_<random> on the same "
    "server and drops it at the end, so the user needs the right to create and drop databases "
    "(PostgreSQL CREATEDB, MySQL/MariaDB CREATE and DROP). Leave the database out to connect to the "
    "server's default (PostgreSQL: the database named like the user; MySQL/MariaDB: none). SQLite: "
    "the file is ignored, a temporary file is used. Default: SQLite plus every PostgreSQL and "
    "MySQL/MariaDB server found or started (see airflow_adrq_bench.servers)"
)

STRATEGY_HELP = (
    f"only these (repeatable; default: all). {DEFAULT_STRATEGY} is the default strategy, what "
    "airflow_adrq.register_asset_change and the Airflow plug-in do: one ordered INSERT ... SELECT for "
    "all the transaction's events just before COMMIT. per_call is its queue_mode='immediate': one "
    "ordered statement per emitted asset, so in multi-outlet transactions it locks asset A's queue "
    "rows and waits for B's while another transaction holds B's and waits for A's: it can deadlock "
    "there, commit_time cannot (one statement takes all locks in one global order). airflow_3_3, "
    "sorted_loop, values_batch: copies of Airflow 3.3.2's loop and two later variants (the baselines)"
)

SCENARIO_HELP = (
    "only these (repeatable; default: all). single: every transaction emits the same asset; "
    "multi_outlet: each emits --outlets assets in random order; with_consumer: multi_outlet while a "
    "scheduler-like process claims queue rows; lost_events: events no run consumes under Airflow "
    "3.3.2's scheduler rule (airflow_3_3 and commit_time only)"
)


def main(argv: Sequence[str] | None = None) -> int:
    """``airflow-adrq bench ARGS`` (the ``airflow_adrq.commands`` entry point; also ``python -m
    airflow_adrq_bench.cli``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # bench --faults / --soak / --airflow have options of their own.
    routed = modes.route(argv)
    if routed is not None:
        return routed
    top = argparse.ArgumentParser(prog="airflow-adrq")
    add_bench_parser(top.add_subparsers())
    args = top.parse_args(["bench", *argv])
    try:
        status: int = args.func(args)
    except (AdrqError, SQLAlchemyError, ValueError) as exc:
        print(f"airflow-adrq: error: {one_line(exc)}", file=sys.stderr)
        return 1
    return status


def add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bench``."""
    parser = subparsers.add_parser(
        "bench",
        help="show Airflow's loops and per-call queueing deadlocking and commit-time queueing not, on your "
        "database",
        description=(
            "Concurrent producer processes (pytest-xdist workers) register asset events through Airflow "
            "3.3.2's whole register_asset_change (and two later loop variants) and through airflow-adrq's "
            f"register_asset_change, per call (per_call) and at commit ({DEFAULT_STRATEGY}, the default); "
            "a scheduler applying Airflow 3.3.2's rule counts events no run consumed; a single caller "
            "compares fan-outs and raw SQL. Prints the tables, each with a legend, and writes bench.json, "
            "bench.md and PNG plots to --out (the processes' scratch files there are removed at the end "
            "unless --keep-scratch). Every planned transaction is reported as committed (ok), gave up "
            "(started, not committed: why is printed) or not started (the round timeout had passed)."
        ),
    )
    options.add_server_options(parser, db_help=DB_HELP)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (the --quick values below): a minute or two for SQLite, PostgreSQL and MariaDB",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: ./bench-results/<UTC timestamp>)",
    )
    parser.add_argument(
        "--keep-scratch",
        action="store_true",
        help="keep the scratch files in --out (barrier files, plan, per-process records, pytest.log)",
    )
    modes = parser.add_argument_group(
        "other modes (each has its own options: airflow-adrq bench --soak --help)",
    )
    modes.add_argument(
        "--faults",
        action="store_true",
        help="producers while their connections are killed at random: what callers see, nothing "
        "duplicated or half-written",
    )
    modes.add_argument(
        "--soak",
        action="store_true",
        help="sustained load (default 32 producers x 1,000 transactions) with a consumer: deadlocks, exact "
        "rows, memory and connection growth",
    )
    modes.add_argument(
        "--airflow",
        action="store_true",
        help="Airflow's own AssetManager vs the plug-in, through Airflow's code on a scratch database "
        "made by airflow db migrate (needs Apache Airflow installed; tox -e airflow-bench)",
    )
    parser.add_argument("--strategy", action="append", choices=STRATEGIES, help=STRATEGY_HELP)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help=SCENARIO_HELP)
    sizes = parser.add_argument_group("sizes (defaults: a few minutes per database on 2 cores)")
    options.add_size_options(
        sizes,
        Sizes,
        lambda name: (
            f"{SIZE_HELP[name]} (default {options.show(getattr(DEFAULT, name))}; "
            f"--quick {options.show(getattr(QUICK, name))})"
        ),
        metavar=_metavar,
    )
    parser.set_defaults(func=_bench)


def _metavar(name: str, kind: str) -> str:
    if kind.startswith("tuple"):
        return "N,N,..."
    return "S" if name.endswith("_s") else "MS" if name.endswith("_ms") else "N"


def _bench(args: argparse.Namespace) -> int:
    missing = [name for name in ("pytest", "xdist", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise runner.BenchError(
            f"airflow-adrq bench needs {', '.join(missing)}: from the checkout, pip install '.[bench]'"
        )
    sizes = options.sizes_from(args, QUICK if args.quick else DEFAULT)
    out = args.out or Path("bench-results") / f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    say = _Progress()
    for url in args.db or ():
        _check_url(url)
    with contextlib.ExitStack() as stack:
        if args.db:
            targets = [runner.describe(url) for url in args.db]
        else:
            targets = [runner.describe("sqlite://")]
            for backend in servers.BACKENDS:
                try:
                    info = stack.enter_context(servers.discover(backend))
                except servers.ServerNotFoundError as exc:
                    say.line(f"not benchmarking {backend}: {exc}")
                    continue
                say.line(f"{info.version}: {info.how_found}")
                targets.append(runner.describe(info.url))
        deadlock_s = max(runner.deadlock_timeout_s(t.url) for t in targets)
        sizes, notes = clear_of_deadlock_timeout(
            sizes, deadlock_s, keep=frozenset(options.given_sizes(args, Sizes))
        )
        say.line(
            f"benchmarking {', '.join(t.version for t in targets)} on {os.cpu_count()} CPUs; "
            f"{sizes.producers} producers x {sizes.transactions} transactions per round, "
            f"fan-out {sizes.fanout}, {sizes.outlets} outlets, hold {sizes.hold_ms:g} ms, round timeout "
            f"{sizes.round_timeout_s:g} s, lock timeout {sizes.lock_timeout_s:g} s; lost events: "
            f"{sizes.lost_producers} producers, {sizes.lost_events} events, holds "
            f"{', '.join(f'{h:g}' for h in sizes.lost_holds_ms)} ms; output in {out}"
        )
        for note in notes:
            say.line(note)
        if any(t.name == "sqlite" for t in targets):
            say.line(f"note: {report.SQLITE_NOTE}")
        raw = runner.run(
            targets,
            sizes,
            out,
            strategies=args.strategy or STRATEGIES,
            scenarios=args.scenario or SCENARIOS,
            progress=say,
            keep_scratch=args.keep_scratch,
        )
    say.done()
    rows = report.aggregate(raw)
    lost = report.aggregate_lost(raw)
    tables = "\n".join(
        part
        for part in (
            report.format_table(raw, rows),
            report.format_lost(raw, lost),
            report.format_sweep(raw),
            report.format_ratio(raw),
        )
        if part
    )
    json_path = out / "bench.json"
    report.write_json(raw, rows, json_path, lost)
    (out / "bench.md").write_text(tables)
    pngs = report.plot(raw, rows, out)
    print(tables)
    print(
        f"took {raw['duration_s']:.0f} s; wrote {json_path}, {out / 'bench.md'}, {', '.join(map(str, pngs))}"
    )
    errors = [
        f"{r['db']} {r['scenario']}/{r['strategy']}: queue rows not exact {r['row_check']}"
        for r in rows
        if not r["rows_exact"]
    ]
    errors += [
        f"{r['db']} lost_events/{r['strategy']} hold {r['hold_ms']:g} ms: "
        f"{r['queue_rows_left']} queue rows left after the drain, "
        f"{r['consumed_unknown']} unknown pairs consumed"
        for r in lost
        if r["queue_rows_left"] or r["consumed_unknown"]
    ]
    errors += report.count_errors(rows, lost)
    errors += [
        f"{db} raw-SQL ratio F={r['fanout']}: queue rows not exact"
        for db, results in raw.get("raw_sql_ratio", {}).items()
        for r in results
        if not r["rows_exact"]
    ]
    for error in errors:
        print(f"ERROR: {error}", file=sys.stderr)
    return 1 if errors else 0


#: Backends the benchmark runs on (SQLite needs no server).
BENCH_BACKENDS = ("sqlite", "postgresql", "mysql", "mariadb")


def _check_url(url: str) -> None:
    """Refuse a --db URL the benchmark cannot use, in one line, before connecting anywhere."""
    import sqlalchemy as sa

    try:
        backend = sa.make_url(url).get_backend_name()
    except sa.exc.ArgumentError:
        raise runner.BenchError(
            f"--db {url!r} is not a database URL (e.g. postgresql://user@host/db)"
        ) from None
    if backend not in BENCH_BACKENDS:
        raise runner.BenchError(
            f"--db {sa.make_url(url).render_as_string(hide_password=True)}: the benchmark runs on SQLite, "
            f"PostgreSQL and MySQL/MariaDB, not {backend!r}"
        )


class _Progress:
    """Progress on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._open = False

    def __call__(self, message: str) -> None:
        if self._tty:
            sys.stderr.write("\r\033[K" + message)
            self._open = True
        else:
            sys.stderr.write(message + "\n")
        sys.stderr.flush()

    def line(self, message: str) -> None:
        self.done()
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self._open:
            sys.stderr.write("\n")
            self._open = False


if __name__ == "__main__":
    sys.exit(main())
