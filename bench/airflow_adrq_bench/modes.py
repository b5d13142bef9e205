"""The other modes of ``airflow-adrq bench``: ``--faults``, ``--soak`` and ``--airflow``.

Each mode has its own options (``airflow-adrq bench --soak --help``), so the
command line is routed here before the main benchmark's parser sees it
(:func:`route`). ``--faults`` and ``--soak`` run on a scratch database on
every PostgreSQL and MySQL/MariaDB server named with ``--db`` or found (as
the main benchmark does), print a table with a legend, and write
``faults.json`` / ``soak.json``. ``--airflow`` is
:mod:`airflow_adrq_bench.airflow_mode` (needs Apache Airflow installed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import dataset, options, servers
from airflow_adrq_bench.faults import FaultSizes, run_faults
from airflow_adrq_bench.soak import SoakSizes, run_soak

__all__ = ["MODES", "route"]

#: The mode flags, in the order ``airflow-adrq bench --help`` lists them.
MODES = ("--faults", "--soak", "--airflow")


def route(argv: Sequence[str]) -> int | None:
    """Run a mode if ``argv`` (after ``bench``) names one; ``None`` for the main benchmark."""
    argv = list(argv)
    if "--airflow" in argv:
        from airflow_adrq_bench import airflow_mode

        return airflow_mode.main([a for a in argv if a != "--airflow"])
    if "--faults" in argv:
        return _run("faults", [a for a in argv if a != "--faults"])
    if "--soak" in argv:
        return _run("soak", [a for a in argv if a != "--soak"])
    return None


_SPECS: dict[str, dict[str, Any]] = {
    "faults": {
        "sizes": FaultSizes,
        "quick": FaultSizes(producers=4, transactions=15, kill_every_s=0.1),
        "about": (
            "producers commit multi-outlet transactions through run_in_transaction while another "
            "connection terminates one of theirs at random (pg_terminate_backend / KILL CONNECTION)"
        ),
    },
    "soak": {
        "sizes": SoakSizes,
        "quick": SoakSizes(producers=8, transactions=50),
        "about": (
            "many producers x many multi-outlet transactions with a scheduler-like consumer deleting "
            "queue rows; deadlocks, exact rows, and memory / connection growth"
        ),
    },
}

_LEGENDS = {
    "faults": [
        "completed: run_in_transaction returned (the transaction committed exactly once)",
        "raised: exceptions the caller saw; only CommitOutcomeUnknownError (connection lost with COMMIT in "
        "flight) and RetriesExhaustedError are acceptable",
        "unknown -> committed / not: how those CommitOutcomeUnknownError transactions actually ended",
        "duplicates: run ids with more events than outlets; half-written: some but not all of a "
        "transaction's events, or a committed event with consumers not queued",
        "retries: attempts replayed from BEGIN, by cause; kills: connections terminated",
    ],
    "soak": [
        "committed: transactions that committed; tx/s over the whole run",
        "deadlocks: retried deadlocks of producers and consumer (must be 0)",
        "rows exact: every emitted (asset, DAG) pair queued or consumed, nothing else",
        "RSS MiB / pool out / server conns: this process's resident memory, the pool's checked-out "
        "connections and the server's connections to the database, before -> during -> after",
    ],
}


def _parser(mode: str) -> argparse.ArgumentParser:
    spec = _SPECS[mode]
    parser = argparse.ArgumentParser(
        prog=f"airflow-adrq bench --{mode}", description=f"{spec['about']}. PostgreSQL and MySQL/MariaDB."
    )
    options.add_server_options(
        parser,
        db_help="a server to run on (repeatable); a scratch database is created there and dropped "
        "(default: every PostgreSQL and MySQL/MariaDB server found, see airflow_adrq_bench.servers)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds per database")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: ./bench-results/<mode>-<UTC time>)"
    )
    defaults = spec["sizes"]()
    options.add_size_options(
        parser.add_argument_group("sizes"),
        spec["sizes"],
        lambda name: f"default {getattr(defaults, name)} (--quick: {getattr(spec['quick'], name)})",
    )
    return parser


def _run(mode: str, argv: list[str]) -> int:
    spec = _SPECS[mode]
    args = _parser(mode).parse_args(argv)
    sizes = options.sizes_from(args, spec["quick"] if args.quick else spec["sizes"]())
    out: Path = (
        args.out or Path("bench-results") / f"{mode}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    )
    runner: Callable[..., Any] = run_faults if mode == "faults" else run_soak
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls = list(args.db or [])
        if not urls:
            for backend in servers.BACKENDS:
                try:
                    urls.append(stack.enter_context(servers.discover(backend)).url)
                except servers.ServerNotFoundError as exc:
                    print(f"not running on {backend}: {exc}", file=sys.stderr)
        if not urls:
            print(
                f"airflow-adrq bench --{mode}: error: no PostgreSQL or MySQL/MariaDB server", file=sys.stderr
            )
            return 1
        for url in urls:
            version = servers.server_version(url)
            print(f"{mode}: {version} ...", file=sys.stderr)
            with dataset.scratch_database(url) as scratch:
                run = runner(scratch, sizes, log=lambda line: print(line, file=sys.stderr))
            results.append({"server": version, **run.as_dict()})
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{mode}.json").write_text(json.dumps(results, indent=2, default=str))
    text = _table(mode, results)
    (out / f"{mode}.md").write_text(text)
    print(text)
    print(f"wrote {out / f'{mode}.json'}, {out / f'{mode}.md'}")
    return 0 if all(_ok(mode, r) for r in results) else 1


def _ok(mode: str, r: dict[str, Any]) -> bool:
    if mode == "faults":
        return bool(
            r["acceptable_errors_only"]
            and r["duplicate_events"] == 0
            and r["half_written"] == 0
            and r["queue_rows_exact"]
        )
    return bool(r["deadlocks"] == 0 and r["rows_exact"] and not r["failed"])


def _table(mode: str, results: list[dict[str, Any]]) -> str:
    if mode == "faults":
        header = [
            "server",
            "transactions",
            "completed",
            "raised",
            "unknown -> committed / not",
            "duplicates",
            "half-written",
            "retries",
            "kills",
            "rows exact",
        ]
        body = [
            [
                r["server"],
                str(r["transactions"]),
                f"{r['completed']} ({r['completed_share']:.1%})",
                ", ".join(f"{k} {v}" for k, v in r["raised"].items()) or "none",
                f"{r['unknown_committed']} / {r['unknown_not_committed']}",
                str(r["duplicate_events"]),
                str(r["half_written"]),
                ", ".join(f"{k} {v}" for k, v in r["retries"].items()) or "none",
                str(r["kills"]),
                "yes" if r["queue_rows_exact"] else "NO",
            ]
            for r in results
        ]
    else:
        header = [
            "server",
            "committed",
            "tx/s",
            "deadlocks",
            "other retries",
            "rows exact",
            "RSS MiB",
            "pool out",
            "server conns",
        ]

        def series(r: dict[str, Any], index: int) -> str:
            samples = r["samples"]
            picked = (samples[0], samples[len(samples) // 2], samples[-1])
            return " -> ".join(str(sample[index]) for sample in picked)

        body = []
        for r in results:
            retries = {
                **r["producer_retries"],
                **{f"consumer {k}": v for k, v in r["consumer_retries"].items()},
            }
            body.append(
                [
                    r["server"],
                    f"{r['committed']}" + (f" (failed {r['failed']})" if r["failed"] else ""),
                    f"{r['tx_per_s']:.0f}",
                    str(r["deadlocks"]),
                    ", ".join(f"{k} {v}" for k, v in retries.items() if k != "deadlock") or "none",
                    "yes" if r["rows_exact"] else f"NO {r['rows']}",
                    series(r, 1),
                    series(r, 2),
                    series(r, 3),
                ]
            )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines += ["", *(f"- {line}" for line in _LEGENDS[mode]), ""]
    return "\n".join(lines)
