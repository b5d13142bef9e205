"""``airflow-adrq bench --airflow --standby``: does the plug-in's SAVEPOINT slow a hot standby?

    airflow-adrq bench --airflow --standby                    # 3 rounds of 90 s phases per manager
    airflow-adrq bench --airflow --standby --overflow-control # then the known trigger, for contrast
    airflow-adrq bench --airflow --standby --quick            # one short round

On PostgreSQL each producing transaction of the plug-in opens one SAVEPOINT (its NOWAIT retry
point), whose row locks take a subtransaction XID; stock Airflow 3.3.2 opens none. GitLab (2021)
and postgres.ai ("Subtransactions considered harmful") traced hot-standby stalls (LWLock
SubtransSLRU) to subtransactions while a long transaction is open on the primary. This mode
starts a throwaway primary and a streaming standby of it (pg_basebackup -R, its own port; both
stopped and removed at the end, also on failure), makes an Airflow database on the primary with
`airflow db migrate`, opens a transaction there (an XID, then idle) for the whole run, and runs
phases: one manager's producer processes at a set rate through Airflow's own code, each process
selecting its manager through [core] asset_manager_class (and _kwargs): stock, the plug-in, and
the plug-in with on_conflict="ignore" (the SAVEPOINT without the DO UPDATE of its default), in
turn, the first rotating each round, every phase with the same load. Meanwhile, on the primary,
the queue rows are consumed (deleted) every second and other writers take XIDs at a steady rate;
on the standby, reader sessions run a scheduler pass's reads in a loop (queue rows joined with
dag and asset, the dag scan, an asset's events) and a sampler counts the wait events of
pg_stat_activity. Per phase: the readers' latency, the waits, the pg_stat_slru deltas on both
servers (Subtrans: pg_subtrans lookups), the SAVEPOINTs sent, the XIDs taken, the open
transaction's age.

--overflow-control then commits one transaction with 65 subtransactions (the standby's snapshots
become suboverflowed while the open transaction lasts: the documented trigger) and runs one more
phase per manager. Verdict: the readers' p99 with the plug-in within 1.2x of stock's (phases
before any overflow), for both plug-in configurations. Needs the PostgreSQL server binaries
(initdb, pg_basebackup, postgres); writes standby.md and standby.json."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench import options
from airflow_adrq_bench.airflow_mode import databases, worker
from airflow_adrq_bench.airflow_mode.config import STANDBY_DEFAULT as DEFAULT
from airflow_adrq_bench.airflow_mode.config import STANDBY_QUICK as QUICK
from airflow_adrq_bench.airflow_mode.config import StandbySizes
from airflow_adrq_bench.airflow_mode.report import raw_opening
from airflow_adrq_bench.airflow_mode.run import Controller
from airflow_adrq_bench.airflow_mode.standby import cluster, observe, report
from airflow_adrq_bench.airflow_mode.standby.writers import Writers

#: Stock, the plug-in as configured by default, and the plug-in with ``on_conflict="ignore"`` (its
#: SAVEPOINT without its ``DO UPDATE``: which of the two a difference comes from).
MANAGERS = ("stock", "plugin", "plugin_ignore")
#: The asset of the warm-ups, and with --shared-asset of every producer; else producer ``i`` emits
#: ``adrq_standby_p<i>``. Every one has the run's ``fanout`` DAGs as its consumers.
ASSET = "adrq_standby"
#: Subtransactions of the --overflow-control transaction: one past the 64 a session caches.
OVERFLOW = 65


def build_parser() -> argparse.ArgumentParser:
    """The options of the standby mode."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="airflow-adrq bench --airflow --standby",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag in ("--airflow", "--standby"):  # what routed the command line here
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", dest="preset", action="store_true", help="one short round")
    where = "output directory (default: ./bench-results/airflow-standby-<UTC time>)"
    parser.add_argument("--out", type=Path, help=where)
    miss = "exit 1 when the plug-in's reader p99 is more than 1.2x stock's"
    parser.add_argument("--check", action="store_true", help=miss)
    only = "only these (repeatable; default: all three)"
    parser.add_argument("--manager", action="append", choices=MANAGERS, help=only)
    parser.set_defaults(out_prefix="airflow-standby-")
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, QUICK)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the standby mode; the exit status (1: a check failed; with --check, also the target missed)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)

    def measure() -> int:
        out = options.out_dir(args)
        started = time.monotonic()
        with cluster.primary_and_standby() as pair:
            options.say(f"{pair.version}: primary and hot standby started; output in {out}")
            managers = [m for m in MANAGERS if not args.manager or m in args.manager]
            raw = StandbyBench(sizes, managers, pair).run([databases.describe(pair.primary_url)])
        return report.conclude(out, raw, check=args.check, started=started)

    return options.guarded(parser, args, measure, airflow="apache-airflow-core 3.3")


class StandbyBench(Controller):
    """The module docstring's run on one primary/standby pair (:meth:`Controller.run` makes the
    database and the producers; :meth:`measure` the rest)."""

    starting = "starting the producer processes"

    def __init__(self, sizes: StandbySizes, managers: Sequence[str], pair: cluster.Pair) -> None:
        self.sizes: StandbySizes = sizes
        self.managers, self.pair = list(managers), pair
        self.dag_ids = [f"adrq_standby_c{i:04d}" for i in range(sizes.fanout)]
        self.order = [m for r in range(sizes.rounds) for m in databases.rotate(self.managers, r)]
        self.order += list(self.managers) if sizes.overflow_control else []
        self.raw: dict[str, Any] = {
            **raw_opening("airflow-adrq bench --airflow --standby", sizes, self.managers),
            "cluster": pair.settings,
            "directories": list(pair.directories),
            "targets": [],
            "phases": [],
        }
        self.steps = 3 + len(self.order)

    def measure(self, url: str) -> dict[str, Any]:
        sizes, primary = self.sizes, self.engine
        standby = databases.control_engine(self.pair.standby_of(url))
        try:
            seeder = self.workers.group(self.managers[0])[0]
            own = [f"{ASSET}_p{i}" for i in range(sizes.producers)]
            seeder.call(worker.seed, dag_ids=self.dag_ids, assets=dict.fromkeys([ASSET, *own], sizes.fanout))
            databases.analyze(primary)
            for manager in self.managers:  # connections, mappers, statement caches; not measured
                self.workers.broadcast(
                    self.workers.group(manager), worker.warmup, assets=[ASSET], run_id=f"w-{manager}"
                )
            databases.clear_queue(primary)
            self.bar.step("seeded and warmed up; the open transaction begins", 1)
            cluster.wait_for_replay(primary, standby)
            held = cluster.OpenTransaction(url)
            writers = Writers(
                url,
                consume_every_s=sizes.consume_every_s,
                xids_per_s=sizes.background_xids,
                dag_ids=self.dag_ids,
                dag_lock_hold_s=sizes.dag_lock_hold_ms / 1000,
            )
            found: dict[str, Any] = {"open_transaction_xid": held.xid}
            try:
                writers.start()
                for n, manager in enumerate(self.order):
                    overflowed = n >= sizes.rounds * len(self.managers)
                    if overflowed and n == sizes.rounds * len(self.managers):
                        cluster.overflow_subtransactions(url, self.dag_ids, OVERFLOW)
                        cluster.wait_for_replay(primary, standby)
                    self.bar.step(f"phase {n + 1}/{len(self.order)}: {manager}", 1)
                    self.raw["phases"].append(self.phase(n, manager, overflowed, url, standby, held))
            finally:
                found["writers"] = writers.stop()
                with primary.connect() as conn:
                    found["open_transaction_age"] = held.age(conn)
                held.close()
            found |= self.checks(primary, standby)
            self.bar.step("checked the standby against the primary", 1)
            return found
        finally:
            standby.dispose()

    def phase(
        self,
        n: int,
        manager: str,
        overflowed: bool,
        url: str,
        standby: sa.Engine,
        held: cluster.OpenTransaction,
    ) -> dict[str, Any]:
        """One phase of ``manager``'s producers at the run's rate, observed on the standby."""
        sizes, primary = self.sizes, self.engine
        per_producer = math.ceil(sizes.rate * sizes.phase_s / sizes.producers)
        pace_s = sizes.producers / sizes.rate
        readers = observe.Observers(
            self.pair.standby_of(url),
            self.dag_ids,
            readers=sizes.readers,
            pause_s=sizes.reader_pause_ms / 1000,
            sample_s=sizes.sample_ms / 1000,
        )
        with primary.connect() as p, standby.connect() as s:
            before, xmax = {"primary": observe.slru(p), "standby": observe.slru(s)}, _xmax(p)
            queue_before = observe.queue_versions(p)
        readers.start(window_s=sizes.consume_every_s)
        began = time.monotonic()
        try:
            args: dict[str, Any] = dict(
                assets=[ASSET],
                own_asset=not sizes.shared_asset,
                run_prefix=f"{manager}-p{n}-",
                transactions=per_producer,
            )
            args |= dict(hold_s=sizes.hold_ms / 1000, budget_s=sizes.phase_s * 1.5 + 10, keep_going=True)
            group = self.workers.group(manager)
            results = self.workers.broadcast(
                group, worker.round_of, sizes.phase_s * 3 + 600, pace_s=pace_s, **args
            )
        finally:
            observed = readers.stop()
        duration = time.monotonic() - began
        lag = cluster.wait_for_replay(primary, standby)
        with primary.connect() as p, standby.connect() as s:
            after, xids = {"primary": observe.slru(p), "standby": observe.slru(s)}, _xmax(p) - xmax
            queue = observe.queue_versions(p)
            streaming = cluster.replication(p)
            age = held.age(p)
        txs = [tx for r in results for tx in r["transactions"]]
        return {
            "phase": n,
            "manager": manager,
            "overflowed": overflowed,
            "duration_s": duration,
            "replay_catch_up_s": lag,
            "transactions": report.transactions(txs),
            "xids": xids,
            "queue_table": {k: v - queue_before[k] for k, v in queue.items()} | {"dead": queue["dead"]},
            "open_transaction_age": age,
            "replication": streaming,
            "slru": {side: observe.slru_delta(after[side], before[side]) for side in ("primary", "standby")},
            "reader": report.reader(observed),
        }

    def checks(self, primary: sa.Engine, standby: sa.Engine) -> dict[str, Any]:
        """After the last phase: the standby has the primary's rows (counted on the primary first,
        then once the standby replayed up to there), the primary streams to it, it is in recovery."""
        counts = {}
        with primary.connect() as conn:
            counts["primary"] = _counts(conn)
            streaming = cluster.replication(conn)
        cluster.wait_for_replay(primary, standby)
        with standby.connect() as conn:
            counts["standby"] = _counts(conn)
            in_recovery = bool(conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar_one())
        return {"counts": counts, "replication": streaming, "standby_in_recovery": in_recovery}


def _counts(conn: sa.Connection) -> dict[str, int]:
    """The rows of the tables the producers write (the events, the queue) on one server."""
    tables = ("asset_event", "asset_dag_run_queue")
    # Table names from the tuple above, never from input.
    return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar_one()) for t in tables}


def _xmax(conn: sa.Connection) -> int:
    """The next XID to be assigned on the primary."""
    return int(conn.exec_driver_sql("SELECT txid_snapshot_xmax(txid_current_snapshot())").scalar_one())
