"""Run the Airflow mode end to end: worker processes, scratch databases, sweep, contention.

The controller (this process) never imports Airflow. It starts ``producers``
worker processes per manager (:class:`.worker.Workers`) while ``airflow db
migrate`` makes every database's scratch database (:func:`.databases.migrated`); then per database:

1. points every worker's Airflow ORM at it, seeds DAGs, assets and schedule
   references through Airflow's models, and runs ``ANALYZE``;
2. the sweep: for each fan-out, one warm-up call per manager, then calls
   interleaved between the managers (the order rotates every repetition),
   each from an empty queue, each followed by an exact-rows check;
3. contention: per scenario and round (managers interleaved), the queue is
   emptied, the manager's producers start together and each runs
   ``transactions`` transactions; afterwards the queue must hold exactly the
   expected rows and ``asset_event`` exactly one row per committed outlet,
   and any transaction still open is ended before the next round starts.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench import progress
from airflow_adrq_bench.airflow_mode import worker
from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, SCENARIOS, Sizes
from airflow_adrq_bench.airflow_mode.databases import (
    Target,
    analyze,
    clear_queue,
    control_engine,
    each_ready,
    end_transactions,
    migrated,
    rotate,
    server_settings,
)
from airflow_adrq_bench.airflow_mode.results import raw_finish, raw_opening
from airflow_adrq_bench.airflow_mode.worker import Workers

Rows = set[tuple[int, str]]


def queued(engine: sa.Engine) -> Rows:
    """The ``(asset_id, target_dag_id)`` rows of the queue."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT asset_id, target_dag_id FROM asset_dag_run_queue"))
        return {(int(r[0]), str(r[1])) for r in rows}


def row_check(actual: Rows, expected: Rows) -> dict[str, Any]:
    """How the queue's rows differ from ``expected`` (up to 5 examples each way)."""
    missing, extra = sorted(expected - actual)[:5], sorted(actual - expected)[:5]
    return {
        "expected": len(expected),
        "actual": len(actual),
        "missing": missing,
        "extra": extra,
        "exact": actual == expected,
    }


def run(
    targets: Sequence[Target],
    sizes: Sizes,
    *,
    managers: Sequence[str],
    scenarios: Sequence[str],
    sweep: bool = True,
    contention: bool = True,
    pg_deadlock_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """Benchmark every target; returns the raw results (see :mod:`.report`)."""
    started = time.monotonic()
    raw: dict[str, Any] = {
        **raw_opening("airflow-adrq bench --airflow", sizes, managers),
        "manager_classes": {m: MANAGER_CLASSES[m] for m in managers},
        "scenarios": list(scenarios),
        "targets": [],
        "sweep": [],
        "rounds": [],
        "skipped": [],
    }
    _Bench(sizes, list(managers), list(scenarios), sweep, contention, pg_deadlock_timeout_ms, raw).run(
        targets
    )
    raw_finish(raw, started)
    return raw


@dataclass
class _Bench:
    """What the run measures, on the worker processes; then, per target, its set-up, sweep and contention."""

    sizes: Sizes
    managers: Sequence[str]
    scenarios: Sequence[str]
    sweep: bool
    contention: bool
    pg_deadlock_timeout_ms: int | None
    raw: dict[str, Any]

    def __post_init__(self) -> None:
        count = max([*self.sizes.fanouts, self.sizes.fanout, 1])
        self.dag_ids = [f"adrq_bench_c{i:04d}" for i in range(count)]

    def scenario_assets(self, scenario: str) -> list[str]:
        return (
            ["adrq_single"]
            if scenario == "single"
            else [f"adrq_multi_{i}" for i in range(self.sizes.outlets)]
        )

    def steps(self) -> int:
        """Progress steps per database: set-up, the sweep's calls, the contention rounds."""
        sweep = len(self.sizes.fanouts) * (self.sizes.sweep_calls + 1) if self.sweep else 0
        rounds = len(self.scenarios) * self.sizes.rounds if self.contention else 0
        return 1 + (sweep + rounds) * len(self.managers)

    def run(self, targets: Sequence[Target]) -> None:
        with (
            tempfile.TemporaryDirectory(prefix="adrq-airflow-bench-") as tmp,
            contextlib.ExitStack() as stack,
        ):
            databases = stack.enter_context(migrated(targets, Path(tmp)))
            with progress.task(
                "starting Airflow worker processes", len(self.managers) * self.sizes.producers
            ) as bar:
                bar.step("each imports Airflow: about 3 s of CPU apiece")
                self.workers = Workers(
                    self.managers, self.sizes.producers, Path(tmp), started=lambda: bar.step("", 1)
                )
            stack.callback(self.workers.close)  # before the scratch databases are dropped
            self.raw["workers"] = self.workers.info
            self.raw["airflow_version"] = self.workers.info[0]["airflow"]
            for target, url, bar in each_ready(databases, self.steps()):
                self.target, self.bar = target, bar
                self.raw["targets"].append(self.measure(url))

    def measure(self, url: str) -> dict[str, Any]:
        began, every = time.monotonic(), list(self.workers.procs.values())
        self.engine = control_engine(url)
        try:
            self.workers.broadcast(
                every, worker.target, url=url, pg_deadlock_timeout_ms=self.pg_deadlock_timeout_ms
            )
            assets = {f"adrq_sweep_f{f:05d}": f for f in self.sizes.fanouts}
            for scenario in SCENARIOS:
                assets |= dict.fromkeys(self.scenario_assets(scenario), self.sizes.fanout)
            seeder = self.workers.group(self.managers[0])[0]
            self.asset_ids: dict[str, int] = seeder.call(worker.seed, dag_ids=self.dag_ids, assets=assets)
            analyze(self.engine)
            self.bar.step("seeded", 1)
            if self.sweep:
                self.one_caller()
            if self.contention:
                self.contend()
            self.workers.broadcast(every, worker.release)
            settings = server_settings(self.engine)
        finally:
            self.engine.dispose()
        described = {"name": self.target.name, "backend": self.target.backend, "version": self.target.version}
        return described | {"settings": settings, "duration_s": time.monotonic() - began}

    def one_caller(self) -> None:
        sizes, managers = self.sizes, self.managers
        callers = {m: self.workers.group(m)[0] for m in managers}
        for fanout in sizes.fanouts:
            asset = f"adrq_sweep_f{fanout:05d}"
            expected = {(self.asset_ids[asset], d) for d in self.dag_ids[:fanout]}

            def one(
                manager: str, call: int, asset: str = asset, fanout: int = fanout, expected: Rows = expected
            ) -> None:
                clear_queue(self.engine)
                self.bar.step(f"one caller, F={fanout:,}: {manager}, call {call + 1}", 1)
                result = callers[manager].call(
                    worker.sweep_call, asset=asset, run_id=f"{manager}-sweep-f{fanout}-{call}"
                )
                check = row_check(queued(self.engine), expected)
                where = {"db": self.target.name, "fanout": fanout, "manager": manager, "call": call}
                found = {"warmup": call < 0, "rows_exact": check["exact"], "check": check}
                self.raw["sweep"].append(where | result | found)

            for manager in managers:
                one(manager, -1)
            started, rep = time.monotonic(), 0
            while rep < sizes.sweep_calls:
                for manager in rotate(managers, rep):
                    one(manager, rep)
                rep += 1
                if rep >= sizes.sweep_min_calls and time.monotonic() - started >= sizes.sweep_budget_s:
                    self.bar.step(
                        f"F={fanout:,}: {sizes.sweep_budget_s:g} s budget spent",
                        (sizes.sweep_calls - rep) * len(managers),
                    )
                    break
        clear_queue(self.engine)

    def contend(self) -> None:
        sizes = self.sizes
        warm = [a for s in self.scenarios for a in self.scenario_assets(s)]
        self.bar.step("contention: warming up every producer (one transaction each)")
        for manager in self.managers:
            self.workers.broadcast(
                self.workers.group(manager), worker.warmup, assets=warm, run_id=f"warmup-{manager}"
            )
        for scenario in self.scenarios:
            assets = self.scenario_assets(scenario)
            expected = {(self.asset_ids[a], d) for a in assets for d in self.dag_ids[: sizes.fanout]}
            stopped: set[str] = set()
            for round_no in range(sizes.rounds):
                for manager in rotate(self.managers, round_no):
                    if manager in stopped:
                        self.bar.step(f"{scenario}: {manager} skipped", 1)
                        continue
                    self.bar.step(f"contention {scenario}, round {round_no + 1}/{sizes.rounds}: {manager}", 1)
                    if (
                        not self.round(scenario, assets, expected, round_no, manager)
                        and round_no + 1 < sizes.rounds
                    ):
                        stopped.add(manager)
                        reason = f"round {round_no + 1} ran out of its {sizes.round_budget_s:g} s budget"
                        where = {"db": self.target.name, "scenario": scenario, "manager": manager}
                        self.raw["skipped"].append(where | {"reason": reason})
        clear_queue(self.engine)

    def round(self, scenario: str, assets: list[str], expected: Rows, round_no: int, manager: str) -> bool:
        """One contention round of ``manager``'s producers; whether every transaction committed."""
        sizes = self.sizes
        clear_queue(self.engine)
        prefix = f"{manager}-{scenario}-r{round_no}-"
        results = self.workers.broadcast(
            self.workers.group(manager),
            worker.round_of,
            timeout=sizes.round_budget_s + 600,
            assets=assets,
            run_prefix=prefix,
            transactions=sizes.transactions,
            hold_s=sizes.hold_ms / 1000,
            budget_s=sizes.round_budget_s,
        )
        # Nothing of this round may hold rows into the next one.
        ended = end_transactions(self.engine)
        txs = [tx for r in results for tx in r["transactions"]]
        committed = sum(1 for tx in txs if tx["ok"])
        check = row_check(queued(self.engine), expected if committed else set())
        with self.engine.connect() as conn:
            sql = sa.text("SELECT count(*) FROM asset_event WHERE source_run_id LIKE :p")
            events = int(conn.execute(sql, {"p": f"{prefix}%"}).scalar_one())
        self.raw["rounds"].append(
            {
                "db": self.target.name,
                "scenario": scenario,
                "manager": manager,
                "round": round_no,
                "duration_s": max(r["end"] for r in results) - min(r["start"] for r in results),
                "committed": committed,
                "abandoned": len(txs) - committed,
                "ended_transactions": ended,
                "events": events,
                "expected_events": committed * len(assets),
                "rows_exact": check["exact"] and events == committed * len(assets),
                "check": check,
                "transactions": txs,
            }
        )
        return committed == len(txs)
