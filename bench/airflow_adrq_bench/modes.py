"""The other modes of ``airflow-adrq bench``: ``--faults``, ``--soak`` and ``--airflow``.

Each mode has its own options (``airflow-adrq bench --soak --help``), so the command line is
routed here before the main benchmark's parser sees it (:func:`route`). ``--faults`` and
``--soak`` run on a scratch database on every PostgreSQL and MySQL/MariaDB server named with
``--db`` or found, print a table with a legend, and write ``faults.json`` / ``soak.json``.
``--airflow`` is :mod:`airflow_adrq_bench.airflow_mode` (needs Apache Airflow installed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from airflow_adrq_bench import dataset, options, tables
from airflow_adrq_bench.load import FaultSizes, SoakSizes, run_faults, run_soak
from airflow_adrq_testing import servers

__all__ = ["MODES", "route"]

#: The mode flags and their help, in the order ``airflow-adrq bench --help`` lists them.
MODES = {
    "--faults": "producers while their connections are killed at random: what callers see, nothing "
    "duplicated or half-written",
    "--soak": "sustained load (default 32 producers x 1,000 transactions) with a consumer: deadlocks, "
    "exact rows, memory and connection growth",
    "--airflow": "Airflow's own AssetManager vs the plug-in, through Airflow's code on a scratch database "
    "made by airflow db migrate (needs Apache Airflow installed; tox -e airflow-bench)",
}


def route(argv: Sequence[str]) -> int | None:
    """Run a mode if ``argv`` (after ``bench``) names one; ``None`` for the main benchmark."""
    if "--airflow" in argv:
        from airflow_adrq_bench import airflow_mode

        return airflow_mode.main([a for a in argv if a != "--airflow"])
    for mode in ("faults", "soak"):
        if f"--{mode}" in argv:
            return _run(mode, [a for a in argv if a != f"--{mode}"])
    return None


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _series(index: int) -> Callable[[dict[str, Any]], str]:
    """Soak samples at the start, the middle and the end: ``before -> during -> after``."""

    def cell(r: dict[str, Any]) -> str:
        samples = r["samples"]
        return " -> ".join(str(s[index]) for s in (samples[0], samples[len(samples) // 2], samples[-1]))

    return cell


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
                {
                    **{k: v for k, v in r["producer_retries"].items() if k != "deadlock"},
                    **{f"consumer {k}": v for k, v in r["consumer_retries"].items()},
                }
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
        prog=f"airflow-adrq bench --{mode}", description=f"{spec['about']}. PostgreSQL and MySQL/MariaDB."
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
    return options.guarded(parser, args, lambda: _measure(mode, parser.prog, args, sizes))


def _measure(mode: str, prog: str, args: argparse.Namespace, sizes: Any) -> int:
    spec = _SPECS[mode]
    out, results = options.out_dir(args), []
    with contextlib.ExitStack() as stack:
        urls = args.db or options.servers_found(stack)
        if not urls:
            options.say(f"{prog}: error: no PostgreSQL or MySQL/MariaDB server")
            return 1
        for url in urls:
            version = servers.server_version(url)
            options.say(f"{mode}: {version} ...")
            with dataset.scratch_database(url) as scratch:
                results.append({"server": version, **spec["run"](scratch, sizes, log=options.say).as_dict()})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{mode}.json").write_text(json.dumps(results, indent=2, default=str))
    text = tables.table(results, spec["columns"], left=1) + "\n\n" + tables.legend(mode)
    failed = [
        f"{r['server']}: the {mode} checks failed (the table says which)"
        for r in results
        if not spec["ok"](r)
    ]
    return options.publish(out / f"{mode}.md", text, [out / f"{mode}.json"], failed)
