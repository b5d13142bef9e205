"""``airflow-adrq bench``: :func:`main`, the ``airflow_adrq.commands`` entry point (:mod:`airflow_adrq.cli`).

The standalone run on scratch databases (``adrq_bench_<random>`` next to the database a ``--db`` URL
names, dropped after; SQLite: a temporary file). Other modes have their own options: ``--faults`` and
``--soak`` (:mod:`.load`) on every PostgreSQL and MySQL/MariaDB server, ``--airflow`` (:mod:`.airflow_mode`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import make_url

from airflow_adrq_bench import exits, options, progress, report, runner, tables, verdict
from airflow_adrq_bench.config import DEFAULT, DEFAULT_STRATEGY, QUICK, SCENARIOS, STRATEGIES, Sizes
from airflow_adrq_bench.config import clear_of_deadlock_timeout as clear
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.load import FaultSizes, SoakSizes, run_faults, run_soak
from airflow_adrq_testing import dataset, servers

DB_HELP = (
    "benchmark this server (repeatable). The database the URL names must exist and is never written to: "
    "the benchmark connects to it to create a scratch database adrq_bench_<random> on the same server "
    "and drops it at the end, so the user needs the right to create and drop databases (PostgreSQL "
    "CREATEDB, MySQL/MariaDB CREATE and DROP). Leave the database out to connect to the server's "
    "default. SQLite: a temporary file is used. Default: SQLite plus every PostgreSQL and MySQL/MariaDB "
    "server found or started (see airflow_adrq_testing.servers)"
)
STRATEGY_HELP = (
    f"only these (repeatable; default: all). {DEFAULT_STRATEGY} is the default strategy, what "
    "register_asset_change and the Airflow plug-in do: one ordered INSERT ... SELECT for all the "
    "transaction's events just before COMMIT. per_call is its queue_mode='immediate': one ordered "
    "statement per emitted asset, so a multi-outlet transaction can deadlock with another holding the "
    "rows it waits for; commit_time cannot (one statement takes all locks in one global order). "
    "airflow_3_3, sorted_loop, values_batch: Airflow 3.3.2's loop and two later variants"
)
SCENARIO_HELP = (
    "only these (repeatable; default: all). single: every transaction emits the same asset; "
    "multi_outlet: each emits --outlets assets in random order; with_consumer: multi_outlet while a "
    "scheduler-like process claims queue rows; lost_events: events no run consumes under Airflow "
    "3.3.2's scheduler rule (airflow_3_3 and commit_time only)"
)
#: The mode flags and their help, in the order ``airflow-adrq bench --help`` lists them.
MODES = {
    "--faults": "producers while their connections are killed at random: what callers see, nothing "
    "duplicated or half-written",
    "--soak": "sustained load (default 32 producers x 1,000 transactions) with a consumer: deadlocks, "
    "exact rows, memory and connection growth",
    "--airflow": "Airflow's own AssetManager vs the plug-in, through Airflow's code on a scratch database "
    "made by airflow db migrate (needs Apache Airflow installed; tox -e airflow-bench)",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``airflow-adrq bench ARGS``; a mode flag (``--faults``, ``--soak``, ``--airflow``) anywhere in
    ``ARGS`` runs that mode instead, with its own options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--airflow" in argv:
        from airflow_adrq_bench import airflow_mode

        return airflow_mode.main([a for a in argv if a != "--airflow"])
    for mode in ("faults", "soak"):
        if f"--{mode}" in argv:
            return _run(mode, [a for a in argv if a != f"--{mode}"])
    parser = bench_parser()
    args = parser.parse_args(argv)
    return options.guarded(parser, args, lambda: _bench(parser, args), prog="airflow-adrq")


def bench_parser() -> argparse.ArgumentParser:
    """The parser of ``airflow-adrq bench`` (its errors show its own usage)."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="airflow-adrq bench",
        epilog=exits.EPILOG,
        formatter_class=options.HelpFormatter,
        description=(
            "Concurrent producer processes register asset events through Airflow "
            "3.3.2's whole register_asset_change (and two later loop variants) and through airflow-adrq's, "
            f"per call (per_call) and at commit ({DEFAULT_STRATEGY}, the default); a scheduler applying "
            "Airflow 3.3.2's rule counts events no run consumed; a single caller compares fan-outs and raw "
            "SQL. Prints the verdict and writes it with the tables (each with a legend) to bench.md, and "
            "bench.json and PNG plots, to --out. Every planned transaction is reported as committed, "
            "gave up (and why) or not started (the round timeout had passed)."
        ),
    )
    quick = ("--quick", "small sizes (the --quick values below)")
    options.add_common(parser, db_help=DB_HELP, preset=quick, out="")
    parser.add_argument("--check", action="store_true", help=exits.CHECK_HELP)
    parser.add_argument("--allow-unclear", action="store_true", help=exits.ALLOW_UNCLEAR_HELP)
    scratch = "keep the scratch files in --out (barrier files, per-process records)"
    parser.add_argument("--keep-scratch", action="store_true", help=scratch)
    group = parser.add_argument_group(
        "other modes (each has its own options: airflow-adrq bench --soak --help)"
    )
    for flag, text in MODES.items():
        group.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--strategy", action="append", choices=STRATEGIES, help=STRATEGY_HELP)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help=SCENARIO_HELP)
    group = parser.add_argument_group("sizes (defaults: a few minutes per database)")
    options.add_fields(group, DEFAULT, QUICK)
    return parser


def _bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    for url in args.db or ():
        if make_url(url).get_backend_name() not in ("sqlite", "postgresql", "mysql", "mariadb"):
            raise BenchError(f"--db {url!r}: the benchmark runs on SQLite, PostgreSQL and MySQL/MariaDB")
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)
    out = options.out_dir(args)
    with contextlib.ExitStack() as stack:
        urls = args.db or ["sqlite://", *options.servers_found(stack)]
        targets = [runner.describe(url) for url in urls]
        deadlock_s = max(runner.deadlock_timeout_s(t.server_url) for t in targets)
        sizes, notes = clear(sizes, deadlock_s, keep=frozenset(options.given(args, Sizes)))
        if "sqlite" in {t.name for t in targets}:
            notes.append(f"note: {report.SQLITE_NOTE}")
        # One line per subject, each under 100 columns once say() wraps it.
        summary = [
            f"benchmarking {', '.join(t.version for t in targets)} on {os.cpu_count()} CPUs",
            f"rounds: {sizes.producers} producers x {sizes.transactions} transactions (single: "
            f"{sizes.single_transactions}), fan-out {sizes.fanout}, {sizes.outlets} outlets, hold "
            f"{sizes.hold_ms:g} ms",
            f"timeouts: round {sizes.round_timeout_s:g} s, lock {sizes.lock_timeout_s:g} s",
            f"lost events: {sizes.lost_producers} producers, {sizes.lost_events} events, holds "
            f"{options.show(sizes.lost_holds_ms)} ms",
            f"output in {out}",
        ]
        for line in [*summary, *notes]:
            options.say(line)
        strategies, scenarios = args.strategy or STRATEGIES, args.scenario or SCENARIOS
        raw = runner.run(
            targets, sizes, out, strategies=strategies, scenarios=scenarios, keep_scratch=args.keep_scratch
        )
    rows, lost = report.aggregate(raw), report.aggregate_lost(raw)
    lines = verdict.standalone(raw, rows, lost)
    board = verdict.format_sides(raw, lines)
    # The detail goes to bench.md (its widest columns to CSV); the terminal gets the verdict.
    detail = [report.format_table(raw, rows), report.format_lost(raw, lost), report.format_sweep(raw)]
    text = "\n".join(part for part in (*detail, report.format_ratio(raw), board) if part)
    found = {"summary": rows, "lost_events": lost, "verdict": [dataclasses.asdict(ln) for ln in lines]}
    tables.write_json(out / "bench.json", found | raw)
    written = [
        out / "bench.json",
        *report.write_csv(raw, rows, lost, out),
        *report.plot(raw, rows, lost, out),
    ]
    judged = exits.judge(
        report.problems(raw, rows, lost), lines, check=args.check, allow_unclear=args.allow_unclear
    )
    return options.publish(out / "bench.md", text, written, judged, took=raw["duration_s"], shown=board)


def _pairs(counts: dict[str, int]) -> str:
    """Counts by kind as a cell: ``deadlock 2, lock_timeout 1`` (``none``)."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _series(index: int) -> Callable[[dict[str, Any]], str]:
    """Soak samples at the start, the middle and the end: ``before -> during -> after``."""
    return lambda r: " -> ".join(str(r["samples"][i][index]) for i in (0, len(r["samples"]) // 2, -1))


_SPECS: dict[str, dict[str, Any]] = {
    "faults": {
        "sizes": FaultSizes,
        "quick": FaultSizes(producers=4, transactions=15, kill_every_s=0.1),
        "run": run_faults,
        "about": "producers commit multi-outlet transactions through run_in_transaction while another "
        "connection terminates one of theirs at random (pg_terminate_backend / KILL CONNECTION)",
        "ok": lambda r: (
            r["acceptable_errors_only"]
            and r["duplicate_events"] == r["half_written"] == 0
            and r["queue_rows_exact"]
        ),
        "columns": {
            "server": "server",
            "transactions": "transactions",
            "completed": lambda r: f"{r['completed']} ({r['completed_share']:.1%})",
            "raised": lambda r: _pairs(r["raised"]),
            "unknown -> committed / not": lambda r: (
                f"{r['unknown_committed']} / {r['unknown_not_committed']}"
            ),
            "duplicates": "duplicate_events",
            "half-written": "half_written",
            "retries": lambda r: _pairs(r["retries"]),
            "kills": "kills",
            "rows exact": "queue_rows_exact",
        },
    },
    "soak": {
        "sizes": SoakSizes,
        "quick": SoakSizes(producers=8, transactions=50),
        "run": run_soak,
        "about": "many producers x many multi-outlet transactions with a scheduler-like consumer deleting "
        "queue rows; deadlocks, exact rows, and memory / connection growth",
        "ok": lambda r: r["deadlocks"] == 0 and r["rows_exact"] and not r["failed"],
        "columns": {
            "server": "server",
            "committed": lambda r: f"{r['committed']}" + (f" (failed {r['failed']})" if r["failed"] else ""),
            "tx/s": lambda r: f"{r['tx_per_s']:.0f}",
            "deadlocks": "deadlocks",
            "other retries": lambda r: _pairs(
                {k: v for k, v in r["producer_retries"].items() if k != "deadlock"}
                | {f"consumer {k}": v for k, v in r["consumer_retries"].items()}
            ),
            "rows exact": lambda r: "yes" if r["rows_exact"] else f"NO {r['rows']}",
            "RSS MiB": _series(1),
            "pool out": _series(2),
            "server conns": _series(3),
        },
    },
}


def _run(mode: str, argv: list[str]) -> int:
    spec = _SPECS[mode]
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=f"airflow-adrq bench --{mode}",
        description=f"{spec['about']}. PostgreSQL and MySQL/MariaDB.",
        epilog=exits.EPILOG,
        formatter_class=options.HelpFormatter,
    )
    options.add_common(
        parser,
        db_help="a server to run on (repeatable); a scratch database is created there and dropped "
        "(default: every PostgreSQL and MySQL/MariaDB server found, see airflow_adrq_testing.servers)",
        preset=("--quick", "small sizes: seconds per database"),
        out=f"{mode}-",
    )
    options.add_fields(parser.add_argument_group("sizes"), spec["sizes"](), spec["quick"])
    args = parser.parse_args(argv)
    sizes = options.sizes_from(parser, args, spec["quick"] if args.preset else spec["sizes"]())
    return options.guarded(parser, args, lambda: _measure(mode, spec, args, sizes))


def _measure(mode: str, spec: dict[str, Any], args: argparse.Namespace, sizes: Any) -> int:
    out, results = options.out_dir(args), []
    with contextlib.ExitStack() as stack:
        urls = args.db or options.servers_found(stack)
        if not urls:
            raise BenchError("no PostgreSQL or MySQL/MariaDB server")
        for url in urls:
            if make_url(url).get_backend_name() not in ("postgresql", "mysql", "mariadb"):
                raise BenchError(f"--db {url!r}: --{mode} runs on PostgreSQL and MySQL/MariaDB")
        with progress.task(f"--{mode}", len(urls)) as task:
            for url in urls:
                version = servers.server_version(url)
                task.step(version)
                with dataset.scratch_database(url) as scratch:
                    results.append({"server": version, **spec["run"](scratch, sizes, log=task.say).as_dict()})
                task.step(version, 1)
    out.mkdir(parents=True, exist_ok=True)
    tables.write_json(out / f"{mode}.json", results)
    text = tables.table(results, spec["columns"], left=1) + "\n\n" + tables.legend(mode)
    bad = [r["server"] for r in results if not spec["ok"](r)]
    failed = [f"{server}: the {mode} checks failed (the table says which)" for server in bad]
    return options.publish(out / f"{mode}.md", text, [out / f"{mode}.json"], exits.judge(failed))
