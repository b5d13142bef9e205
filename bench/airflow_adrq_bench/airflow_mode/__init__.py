"""``airflow-adrq bench --airflow``: the asset managers measured through Apache Airflow's own code.

    airflow-adrq bench --airflow                 # SQLite + every PostgreSQL/MariaDB server found or started
    airflow-adrq bench --airflow --quick         # small sizes
    airflow-adrq bench --airflow --db postgresql://user@host/postgres --db mysql://root@host/mysql
    python -m airflow_adrq_bench.airflow_mode ...  # the same

Needs apache-airflow-core 3.3 (with asyncpg / aiomysql for `airflow db migrate`) in the same environment
(tox -e airflow-bench). Three asset managers, each in processes of its own that select it through
[core] asset_manager_class: Airflow's AssetManager (stock), the same with each event's DAGs sorted
(sorted_loop), and airflow_adrq.airflow.AdrqAssetManager (plugin): one caller across fan-outs, then concurrent
producer processes. Each database URL only names a server: a scratch database is created there, migrated by
`airflow db migrate` and dropped afterwards; a URL whose database has Airflow tables is refused. Writes the
tables (with a legend) as Markdown and JSON, and prints the verdict: the plug-in's targets, met or missed
(--check: exit 1 on a miss, 3 on an unclear target). Also: --accounting (asset events no run consumes,
with Airflow's own scheduler method as the consumer), --live (a real deployment), --db-cost (what one
task success costs the database: XIDs, WAL, MultiXacts, pages) and --standby (a hot standby's reads while
producers run); each has its own --help."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from airflow_adrq_bench import exits, options
from airflow_adrq_bench.airflow_mode import databases, report, run
from airflow_adrq_bench.airflow_mode.config import DEFAULT, MANAGERS, QUICK, SCENARIOS, Sizes
from airflow_adrq_testing import servers


def parser_for(
    doc: str, mode: str = "", preset: tuple[str, str] = ("--quick", "small sizes")
) -> argparse.ArgumentParser:
    """A parser of an Airflow mode (``mode``: ``--accounting``, ``--live``) with every mode's options."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=" ".join(("airflow-adrq bench --airflow", mode)).strip(),
        description=doc,
        epilog=exits.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_common(
        parser,
        db_help="measure on this server (repeatable): a scratch database is created on it and dropped; "
        "refused if the URL's own database has Airflow tables",
        preset=preset,
        out=f"airflow-{mode[2:]}-" if mode else "airflow-",
        routing=("--airflow", *([mode] if mode else [])),
        # The live mode needs a server Airflow's LocalExecutor supports; --db-cost reads a server's
        # counters: not SQLite.
        backends=servers.BACKENDS if mode in ("--live", "--db-cost") else ("sqlite", *servers.BACKENDS),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Airflow mode; returns the exit status (:mod:`.exits`; 1: rows not exact, a plug-in
    deadlock, or with ``--check`` a missed target)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Imported only when asked for.
    for flag, mode in (
        ("--accounting", "accounting"),
        ("--live", "live"),
        ("--db-cost", "dbcost"),
        ("--standby", "standby"),
    ):
        if flag in argv:
            return int(importlib.import_module(f"{__name__}.{mode}").main(argv))
    parser = parser_for(__doc__ or "")
    parser.add_argument(
        "--accounting", action="store_true", help="instead: the accounting mode (--accounting --help)"
    )
    parser.add_argument("--live", action="store_true", help="instead: a live deployment (--live --help)")
    parser.add_argument(
        "--db-cost",
        action="store_true",
        help="instead: what one task success costs the database (--db-cost --help)",
    )
    standby = "instead: a hot standby's reads while producers run (--standby --help)"
    parser.add_argument("--standby", action="store_true", help=standby)
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (repeatable)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="only these (repeatable)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the one-caller sweep")
    parser.add_argument("--no-contention", action="store_true", help="skip the contention runs")
    parser.add_argument("--check", action="store_true", help=exits.CHECK_HELP)
    parser.add_argument("--allow-unclear", action="store_true", help=exits.ALLOW_UNCLEAR_HELP)
    parser.add_argument(
        "--pg-deadlock-timeout-ms",
        type=int,
        help="PostgreSQL: SET deadlock_timeout on the producers' connections (needs superuser; "
        "default: the server's setting)",
    )
    sizes_group = parser.add_argument_group("sizes (defaults: a few minutes per database)")
    options.add_fields(sizes_group, DEFAULT, QUICK)
    args = parser.parse_args(argv)
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)
    return options.guarded(parser, args, lambda: _bench(args, sizes), airflow="apache-airflow-core 3.3")


def _bench(args: argparse.Namespace, sizes: Sizes) -> int:
    out = options.out_dir(args)
    managers = [m for m in MANAGERS if not args.manager or m in args.manager]
    scenarios = [s for s in SCENARIOS if not args.scenario or s in args.scenario]
    with databases.targets(args.db or [], args.backend, sqlite=True) as targets:
        options.say(
            f"benchmarking {', '.join(t.version for t in targets)}: managers {', '.join(managers)}; "
            f"one caller at fan-outs {options.show(sizes.fanouts)}; {sizes.producers} producers x "
            f"{sizes.transactions} transactions x {sizes.rounds} round(s), fan-out {sizes.fanout}, hold "
            f"{sizes.hold_ms:g} ms, scenarios {', '.join(scenarios)}; output in {out}"
        )
        contend, sweep, timeout_ms = not args.no_contention, not args.no_sweep, args.pg_deadlock_timeout_ms
        raw = run.Bench(sizes, managers, scenarios, sweep, contend, timeout_ms).run(targets)
    summary = report.summarize(raw)
    lines = report.verdict(raw, summary)
    judged = exits.judge(
        report.errors(raw, summary), lines, check=args.check, allow_unclear=args.allow_unclear
    )
    raw["summary"] = summary
    return report.conclude(out / "airflow-bench", raw, report.format_tables(raw, summary), lines, judged)
