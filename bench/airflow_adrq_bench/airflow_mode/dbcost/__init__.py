"""``airflow-adrq bench --airflow --db-cost``: what one task success costs the database, stock/plug-in.

    airflow-adrq bench --airflow --db-cost               # throwaway PostgreSQL and MariaDB servers
    airflow-adrq bench --airflow --db-cost --quick       # F=1,64; 3 successes; 4 producers x 2
    airflow-adrq bench --airflow --db-cost --backend postgresql --fanouts 1,64,1024

A task success is Airflow 3.3.2's Execution API route ti_update_state, called as a function in the
Airflow mode's worker processes (each bound to Airflow's AssetManager, "stock", or to
airflow_adrq.airflow.AdrqAssetManager, "plugin", through [core] asset_manager_class): the task
instance locked and set SUCCESS, its outlet registered, a log row, COMMIT. Per database, fan-out F
(consumer DAGs of the asset), scenario and callers (one caller, or --producers processes at once on
the same consumers), a cell per manager, managers taking turns: the tables vacuumed, CHECKPOINT,
the task successes, then what they cost per success (XIDs, WAL bytes, records and full-page images,
MultiXacts and their members, pages dirtied per table) and per statement. Scenarios: "new", every
success emits an asset of its own with the same F consumers (each queues F new rows); "queued",
every success emits one asset whose F rows a committed success queued before.

Each server is a throwaway of its own, started from the installed binaries (PostgreSQL with
pg_stat_statements, pg_walinspect and pg_buffercache; MariaDB with every InnoDB monitor), so that
nothing else counts; with --db, every figure includes whatever else that server does meanwhile.
How each figure is read: dbcost/postgresql.py and dbcost/mariadb.py (their docstrings)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from airflow_adrq_bench import options, progress
from airflow_adrq_bench.airflow_mode import databases, parser_for, processes, worker
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN as MANAGERS
from airflow_adrq_bench.airflow_mode.dbcost import mariadb, postgresql, report, success
from airflow_adrq_bench.airflow_mode.report import raw_opening
from airflow_adrq_bench.airflow_mode.run import Controller
from airflow_adrq_bench.options import Checked, count
from airflow_adrq_testing import dataset, servers

#: ``new``: each success queues F rows of its own asset; ``queued``: the asset's F rows are queued already.
SCENARIOS = ("new", "queued")


@dataclass(frozen=True)
class DbCostSizes(Checked):
    """How big a run is: per database ``len(fanouts) * len(scenarios) * 2`` cells of each manager."""

    fanouts: tuple[int, ...] = count((1, 64, 1024), "consumer DAGs (F) of every asset")
    successes: int = count(5, "task successes per one-caller cell, one after another")
    producers: int = count(8, "producer processes per manager at once in the concurrent cells")
    transactions: int = count(4, "task successes per producer in a concurrent cell")


DEFAULT = DbCostSizes()
QUICK = DbCostSizes(fanouts=(1, 64), successes=3, producers=4, transactions=2)

#: The counters of each backend (``mysql``: MariaDB and MySQL).
COUNTERS: dict[str, ModuleType] = {"postgresql": postgresql, "mysql": mariadb}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mode; the exit status (1: a check failed: rows, events, a task not SUCCESS)."""
    parser = parser_for(__doc__ or "", "--db-cost", ("--quick", "small: F=1,64, fewer successes"))
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="only these (repeatable)")
    parser.add_argument("--no-concurrent", action="store_true", help="one caller only")
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, QUICK)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)
    scenarios = [s for s in SCENARIOS if not args.scenario or s in args.scenario]
    callers = [1] if args.no_concurrent else [1, sizes.producers]

    def measure() -> int:
        out = options.out_dir(args)
        with _targets(args.db or [], args.backend) as found:
            raw = DbCost(sizes, scenarios, callers).run(found)
        return report.conclude(out / "airflow-db-cost", raw)

    return options.guarded(parser, args, measure, airflow="apache-airflow-core 3.3")


@contextlib.contextmanager
def _targets(urls: Sequence[str], backends: Sequence[str] | None) -> Iterator[list[dataset.Target]]:
    """``urls``, or a throwaway server per backend with the counters' settings."""
    if urls:
        with databases.targets(urls, None, sqlite=False) as found:
            yield found
        return
    starts = {"postgresql": servers.start_postgresql, "mysql": servers.start_mysql}
    with contextlib.ExitStack() as stack:
        found = []
        for backend in [b for b in servers.BACKENDS if not backends or b in backends]:
            try:
                info = stack.enter_context(starts[backend](COUNTERS[backend].SETTINGS))
            except servers.ServerNotFoundError as exc:
                options.say(f"not measuring {backend}: {exc}")
                continue
            options.say(f"{info.version}: {info.how_found}")
            found.append(databases.describe(info.url))
        if not found:
            raise servers.ServerNotFoundError("no database server to measure on")
        yield dataset.unique_names(found)


@dataclass(frozen=True)
class Cell:
    """One measurement: a manager's task successes at a fan-out, in a scenario, by ``callers`` at once."""

    fanout: int
    scenario: str
    callers: int
    manager: str

    @property
    def name(self) -> str:
        return f"f{self.fanout}-{self.scenario}-c{self.callers}-{self.manager}"


class DbCost(Controller):
    """The cells on every target, each between two CHECKPOINTs (:meth:`cell`)."""

    starting = "starting Airflow worker processes (task successes through ti_update_state)"
    # Controller reads only ``producers`` of its sizes, which every mode's sizes have.
    sizes: DbCostSizes  # type: ignore[assignment]

    def __init__(self, sizes: DbCostSizes, scenarios: Sequence[str], callers: Sequence[int]) -> None:
        self.sizes, self.managers = sizes, MANAGERS
        self.scenarios, self.callers = list(scenarios), list(callers)
        self.raw = raw_opening("airflow-adrq bench --airflow --db-cost", sizes, self.managers)
        self.raw |= {"scenarios": self.scenarios, "callers": self.callers, "targets": [], "cells": []}
        self.dag_ids = [f"adrq_dbc_c{i:04d}" for i in range(max(sizes.fanouts))]
        self.cells = [
            Cell(f, s, c, m)
            for f in sizes.fanouts
            for s in self.scenarios
            for n, c in enumerate(self.callers)
            for m in databases.rotate(self.managers, n)
        ]
        self.steps = 2 + len(self.cells)
        self.runs = 0

    def planned(self, callers: int) -> int:
        """Task successes of a cell with ``callers`` at once."""
        return self.sizes.successes if callers == 1 else callers * self.sizes.transactions

    def assets(self, cell: Cell) -> list[str]:
        n = self.planned(cell.callers)
        if cell.scenario == "queued":
            return [f"adrq_dbc_f{cell.fanout}_q"] * n
        return [f"adrq_dbc_f{cell.fanout}_n{i}" for i in range(n)]

    def measure(self, url: str) -> dict[str, Any]:
        self.url = url
        self.counters = COUNTERS[self.engine.dialect.name]
        self.counters.prepare(self.engine)
        most = max(self.planned(c) for c in self.callers)
        fanout_of = {"adrq_dbc_warm": 1}
        for f in self.sizes.fanouts:
            fanout_of |= {f"adrq_dbc_f{f}_q": f} | {f"adrq_dbc_f{f}_n{i}": f for i in range(most)}
        self.seeder = self.workers.group(self.managers[0])[0]
        self.asset_ids: dict[str, int] = self.seeder.call(worker.seed, dag_ids=self.dag_ids, assets=fanout_of)
        databases.analyze(self.engine)
        self.bar.step("seeded; warming up every producer (one task success each)", 1)
        procs = [p for m in self.managers for p in self.workers.group(m)]
        ids = self.seed_tis("warmup", len(procs))
        for proc, ti_id in zip(procs, ids, strict=True):
            proc.call(success.succeed, ti_ids=[ti_id], assets=["adrq_dbc_warm"])
        self.counters.settle(self.engine)
        self.bar.step("warm", 1)
        for cell in self.cells:
            self.bar.step(f"F={cell.fanout:,} {cell.scenario}, {cell.callers} caller(s): {cell.manager}", 1)
            self.raw["cells"].append(self.cell(cell))
        return {"counters": self.counters.__name__.rpartition(".")[2]}

    def start(self, stack: contextlib.ExitStack, home: Path, bar: progress.Task) -> None:
        """As many producers per manager as the most callers of a cell."""
        step = lambda: bar.step("", 1)  # noqa: E731
        self.workers = worker.Workers(self.managers, max(self.callers), home, step)
        stack.callback(processes.close_all, self.workers.procs.values())

    def seed_tis(self, label: str, n: int) -> list[str]:
        """``n`` RUNNING task instances in a DAG run of their own (committed before any cell opens)."""
        self.runs += 1
        run_id = f"dbc-{self.runs:04d}-{label}"
        ids: list[str] = self.seeder.call(success.seed, run_id=run_id, task_ids=[f"t{i}" for i in range(n)])
        return ids

    def cell(self, cell: Cell) -> dict[str, Any]:
        """Prepare (queue emptied, primed for ``queued``, task instances seeded), open, run, close, check."""
        databases.clear_queue(self.engine)
        procs = self.workers.group(cell.manager)[: cell.callers]
        assets = self.assets(cell)
        if cell.scenario == "queued":  # the rows this asset's successes find queued, by the same manager
            procs[0].call(success.succeed, ti_ids=self.seed_tis("prime", 1), assets=assets[:1])
        ti_ids = self.seed_tis(cell.name, len(assets))
        opened = self.counters.open_cell(self.engine)
        began = time.monotonic()
        calls, each = [], []
        if cell.callers == 1:
            mark = opened["mark"]
            # MariaDB has no per-statement counters: the caller reads the redo LSN around each statement.
            probe = self.url if self.engine.dialect.name == "mysql" else None
            # No transaction of ours stays open across a success: it would hold back pruning.
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                for ti_id, asset in zip(ti_ids, assets, strict=True):
                    one = {"ti_ids": [ti_id], "assets": [asset], "redo_probe": probe}
                    calls += procs[0].call(success.succeed, **one)["calls"]
                    mark, before = self.counters.mark(conn), mark
                    each.append(self.counters.between(conn, before, mark))
        else:
            per, start_at = self.sizes.transactions, time.time() + 1.0  # every producer at once
            futures = [
                proc.submit(
                    success.succeed,
                    ti_ids=ti_ids[i * per : (i + 1) * per],
                    assets=assets[i * per : (i + 1) * per],
                    start_at=start_at,
                )
                for i, proc in enumerate(procs)
            ]
            for proc, future in zip(procs, futures, strict=True):
                calls += proc.result(future, 1800)["calls"]
        seconds = time.monotonic() - began
        closed: dict[str, Any] = self.counters.close_cell(self.engine, opened)
        where = {"db": self.target.name, "backend": self.engine.dialect.name}
        found = {"planned": len(assets), "seconds": seconds, "calls": calls, "per_success": each}
        return where | vars(cell) | found | closed | {"checks": self.check(cell, ti_ids, assets)}

    def check(self, cell: Cell, ti_ids: list[str], assets: list[str]) -> dict[str, Any]:
        """After the cell closed: the task instances' states, the events written, the queue's rows."""
        with self.engine.connect() as conn:
            states = Counter(
                str(s)
                for (s,) in databases.fetch(
                    conn, "SELECT state FROM task_instance WHERE id IN :ids", ids=ti_ids
                )
            )
            events = databases.fetch(
                conn,
                "SELECT count(*) FROM asset_event e JOIN task_instance t ON t.dag_id = e.source_dag_id "
                "AND t.run_id = e.source_run_id AND t.task_id = e.source_task_id WHERE t.id IN :ids",
                ids=ti_ids,
            )[0][0]
            queued = dataset.queued_pairs(conn)
        expected = {(self.asset_ids[a], d) for a in set(assets) for d in self.dag_ids[: cell.fanout]}
        exact = queued == expected
        return {"states": dict(states), "events": int(events), "rows_exact": exact, "rows": len(queued)}
