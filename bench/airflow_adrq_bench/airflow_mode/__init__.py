"""``airflow-adrq bench --airflow``: the asset managers measured through Apache Airflow's own code.

::

    airflow-adrq bench --airflow                 # SQLite + every PostgreSQL/MariaDB server found or started
    airflow-adrq bench --airflow --quick         # about a minute per database
    airflow-adrq bench --airflow --db postgresql://user@host/postgres --db mysql://root@host/mysql
    python -m airflow_adrq_bench.airflow_mode ...  # the same

Needs ``apache-airflow-core`` 3.3 (with ``asyncpg`` / ``aiomysql`` for
``airflow db migrate``) and ``matplotlib`` in the same environment (``tox -e
airflow-bench``). Three asset managers, each in processes of its own that
select it through ``[core] asset_manager_class``: Airflow's ``AssetManager``
(``stock``), the same with each event's DAGs sorted (``sorted_loop``), and
``airflow_adrq.airflow.AdrqAssetManager`` (``plugin``). Each database URL only
names a server: a scratch database is created there, migrated by ``airflow db
migrate`` and dropped afterwards; a URL whose database has Airflow tables is
refused. Prints the tables (with a legend) and writes JSON, Markdown and one
PNG per database.

Modules: :mod:`.config` (sizes, names, targets), :mod:`.sorted_loop` (the
``sorted_loop`` manager), :mod:`.worker` (an Airflow process), :mod:`.run`
(the controller), :mod:`.report` (tables, JSON, PNG).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import options, servers
from airflow_adrq_bench.airflow_mode import report, run
from airflow_adrq_bench.airflow_mode.config import DEFAULT, MANAGERS, QUICK, SCENARIOS, Sizes

__all__ = ["build_parser", "main"]

_BACKENDS = ("sqlite", *servers.BACKENDS)


def build_parser(prog: str = "airflow-adrq bench --airflow") -> argparse.ArgumentParser:
    """The options of the Airflow mode."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Airflow's own AssetManager (stock), 3.3's with sorted rows (sorted_loop) and airflow-adrq's "
            "plug-in, each enabled through [core] asset_manager_class, through the installed Airflow's "
            "code paths (3.3 or 3.4) on scratch databases made by `airflow db migrate`: one caller across "
            "fan-outs, then concurrent producer processes. Without --db: SQLite plus every PostgreSQL and "
            "MySQL/MariaDB "
            "server found (see airflow_adrq_bench.servers)."
        ),
    )
    options.add_routing_flags(parser, "--airflow")
    parser.add_argument(
        "--accounting",
        action="store_true",
        help="instead: asset events no run consumes, stock vs plug-in, with Airflow's own scheduler method "
        "as the consumer (its own options: --accounting --help; see .accounting)",
    )
    options.add_server_options(
        parser,
        db_help="benchmark this server (repeatable): a scratch database is created on it and dropped; "
        "refused if the URL's own database has Airflow tables",
        backends=_BACKENDS,
        backend_help="without --db: only these (repeatable; default: all found)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: about a minute per database")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: bench-results/airflow-<UTC time>)"
    )
    parser.add_argument("--manager", action="append", choices=MANAGERS, help="only these (repeatable)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="only these (repeatable)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the one-caller sweep")
    parser.add_argument("--no-contention", action="store_true", help="skip the contention runs")
    parser.add_argument(
        "--pg-deadlock-timeout-ms",
        type=int,
        default=None,
        help="PostgreSQL: SET deadlock_timeout on the producers' connections (needs superuser; "
        "default: the server's setting)",
    )
    sizes = parser.add_argument_group("sizes (defaults: a few minutes per database on 2 cores)")
    options.add_size_options(
        sizes,
        Sizes,
        lambda name: f"default {getattr(DEFAULT, name)!r}, --quick {getattr(QUICK, name)!r}",
        kinds={"tuple[int, ...]": _fanouts},
    )
    return parser


def _fanouts(text: str) -> tuple[int, ...]:
    # Sizes checks no values: a fan-out of 0 would seed an asset without consumers.
    values = options.int_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"fan-outs must be at least 1, not {text!r}")
    return values


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _missing_requirements() -> list[str]:
    wanted = {"airflow": "apache-airflow-core 3.3", "matplotlib": "matplotlib"}
    return [label for module, label in wanted.items() if importlib.util.find_spec(module) is None]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Airflow mode; returns the exit status (1: a failure, rows not exact, or a plug-in deadlock)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--accounting" in argv:
        from airflow_adrq_bench.airflow_mode import accounting

        return accounting.main(argv)
    if "--live" in argv:
        from airflow_adrq_bench.airflow_mode import live

        return live.main(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    options.check_server_options(parser, args)
    missing = _missing_requirements()
    if missing:
        _say(
            f"airflow-adrq bench --airflow: error: needs {', '.join(missing)} in this environment "
            "(from a checkout: tox -e airflow-bench)"
        )
        return 1
    try:
        return _bench(args)
    except (AdrqError, SQLAlchemyError) as exc:
        _say(f"airflow-adrq bench --airflow: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("airflow-adrq bench --airflow: interrupted (workers stopped, scratch databases dropped)")
        return 130


def _bench(args: argparse.Namespace) -> int:
    sizes = options.sizes_from(args, QUICK if args.quick else DEFAULT)
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    out: Path = args.out or Path("bench-results") / f"airflow-{stamp}"
    managers = [m for m in MANAGERS if not args.manager or m in args.manager]
    scenarios = [s for s in SCENARIOS if not args.scenario or s in args.scenario]
    with run.targets(args.db or [], args.backend, sqlite=True, say=_say) as targets:
        _say(
            f"benchmarking {', '.join(t.version for t in targets)}: managers {', '.join(managers)}; "
            f"one caller at fan-outs {', '.join(map(str, sizes.fanouts))}; {sizes.producers} producers x "
            f"{sizes.transactions} transactions x {sizes.rounds} round(s), fan-out {sizes.fanout}, hold "
            f"{sizes.hold_ms:g} ms, scenarios {', '.join(scenarios)}; output in {out}"
        )
        raw = run.run(
            targets,
            sizes,
            managers=managers,
            scenarios=scenarios,
            sweep=not args.no_sweep,
            contention=not args.no_contention,
            pg_deadlock_timeout_ms=args.pg_deadlock_timeout_ms,
            progress=_say,
        )
    summary = report.summarize(raw)
    text = report.format_tables(raw, summary)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "airflow-bench.json"
    report.write_json(raw, summary, json_path)
    (out / "airflow-bench.md").write_text(text)
    pngs = report.plot(raw, summary, out)
    print(text)
    written = ", ".join(map(str, [json_path, out / "airflow-bench.md", *pngs]))
    print(f"took {raw['duration_s']:.0f} s; wrote {written}")
    problems = report.errors(raw, summary)
    for problem in problems:
        _say(f"ERROR: {problem}")
    return 1 if problems else 0
