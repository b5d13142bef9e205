"""Run the Airflow mode end to end: worker processes, scratch databases, sweep, contention.

The controller (this process) never imports Airflow. It starts ``producers``
worker processes per manager (:class:`.worker.Workers`), and for every database:

1. creates a scratch database and runs ``airflow db migrate`` on it;
2. points every worker's Airflow ORM at it, seeds DAGs, assets and schedule
   references through Airflow's models, and runs ``ANALYZE``;
3. the sweep: for each fan-out, one warm-up call per manager, then calls
   interleaved between the managers (the order rotates every repetition),
   each from an empty queue, each followed by an exact-rows check;
4. contention: per scenario and round (managers interleaved), the queue is
   emptied, the manager's producers start together and each runs
   ``transactions`` transactions; afterwards the queue must hold exactly the
   expected rows and ``asset_event`` exactly one row per committed outlet.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, Sizes, raw_finish, raw_opening
from airflow_adrq_bench.airflow_mode.databases import (
    AIRFLOW_TABLES,
    Target,
    airflow_url,
    analyze,
    clear_queue,
    control_engine,
    describe,
    refuse_airflow_database,
    rotate,
    scratch_database,
    server_settings,
    targets,
)
from airflow_adrq_bench.airflow_mode.processes import (
    airflow_settings,
    clean_environ,
    start_migrate,
    wait_migrate,
)
from airflow_adrq_bench.airflow_mode.worker import Workers
from airflow_adrq_bench.errors import BenchError

# The databases' names are part of this module's interface (the CLI and the tests use them here).
__all__ = [
    "AIRFLOW_TABLES",
    "BenchError",
    "Target",
    "airflow_url",
    "control_engine",
    "describe",
    "refuse_airflow_database",
    "run",
    "targets",
]

Rows = set[tuple[int, str]]


def _queue(engine: sa.Engine) -> Rows:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT asset_id, target_dag_id FROM asset_dag_run_queue"))
        return {(int(r[0]), str(r[1])) for r in rows}


def _events(engine: sa.Engine, prefix: str) -> int:
    sql = sa.text("SELECT count(*) FROM asset_event WHERE source_run_id LIKE :p")
    with engine.connect() as conn:
        return int(conn.execute(sql, {"p": f"{prefix}%"}).scalar_one())


def _row_check(actual: Rows, expected: Rows) -> dict[str, Any]:
    missing, extra = expected - actual, actual - expected
    return {
        "expected": len(expected),
        "actual": len(actual),
        "missing": [list(r) for r in sorted(missing)[:5]],
        "extra": [list(r) for r in sorted(extra)[:5]],
    }


@dataclass
class _Plan:
    sizes: Sizes
    managers: Sequence[str]
    scenarios: Sequence[str]
    sweep: bool
    contention: bool
    pg_deadlock_timeout_ms: int | None

    @property
    def dag_ids(self) -> list[str]:
        count = max([*self.sizes.fanouts, self.sizes.fanout, 1])
        return [f"adrq_bench_c{i:04d}" for i in range(count)]

    def scenario_assets(self, scenario: str) -> list[str]:
        return (
            ["adrq_single"]
            if scenario == "single"
            else [f"adrq_multi_{i}" for i in range(self.sizes.outlets)]
        )

    def assets(self) -> dict[str, int]:
        out = {f"adrq_sweep_f{f:05d}": f for f in self.sizes.fanouts}
        for scenario in ("single", "multi_outlet"):
            out.update(dict.fromkeys(self.scenario_assets(scenario), self.sizes.fanout))
        return out


def run(
    targets: Sequence[Target],
    sizes: Sizes,
    *,
    managers: Sequence[str],
    scenarios: Sequence[str],
    sweep: bool = True,
    contention: bool = True,
    pg_deadlock_timeout_ms: int | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Benchmark every target; returns the raw results (see :mod:`.report`)."""
    plan = _Plan(sizes, list(managers), list(scenarios), sweep, contention, pg_deadlock_timeout_ms)
    started = time.monotonic()
    raw: dict[str, Any] = {
        **raw_opening("airflow-adrq bench --airflow", sizes, managers),
        "manager_classes": {m: MANAGER_CLASSES[m] or "airflow.assets.manager.AssetManager" for m in managers},
        "scenarios": list(scenarios),
        "targets": [],
        "workers": [],
        "sweep": [],
        "rounds": [],
        "skipped": [],
    }
    workdir = Path(tempfile.mkdtemp(prefix="adrq-airflow-bench-"))
    workers: Workers | None = None
    try:
        progress(
            f"starting {len(managers)} x {sizes.producers} Airflow worker processes "
            "(each imports Airflow: about 3 s of CPU apiece)"
        )
        workers = Workers(managers, sizes.producers, workdir)
        raw["workers"] = [p.info for p in workers.procs.values()]
        raw["airflow_version"] = raw["workers"][0]["airflow"]
        for target in targets:
            raw["targets"].append(_Target(target, plan, workers, raw, progress).run(workdir))
    finally:
        if workers is not None:
            workers.close()
        shutil.rmtree(workdir, ignore_errors=True)
    raw_finish(raw, started)
    return raw


@dataclass
class _Target:
    """One target's measurements: set-up, the sweep, contention (each a phase with its seconds)."""

    target: Target
    plan: _Plan
    workers: Workers
    raw: dict[str, Any]
    progress: Callable[[str], None]

    def say(self, text: str) -> None:
        self.progress(f"{self.target.version}: {text}")

    def run(self, workdir: Path) -> dict[str, Any]:
        began = last = time.monotonic()
        phases: dict[str, float] = {}

        def lap(name: str) -> None:
            nonlocal last
            phases[name] = round(time.monotonic() - last, 2)
            last = time.monotonic()

        with scratch_database(self.target, workdir) as url:
            self.say("airflow db migrate on a scratch database")
            log = workdir / "db-migrate.log"
            wait_migrate(start_migrate(clean_environ(airflow_settings(workdir, url)), log), log)
            lap("migrate_s")
            every = list(self.workers.procs.values())
            self.engine = control_engine(url)
            try:
                self.workers.broadcast(
                    every, "target", url=url, pg_deadlock_timeout_ms=self.plan.pg_deadlock_timeout_ms
                )
                seeder = self.workers.group(self.plan.managers[0])[0]
                self.asset_ids: dict[str, int] = seeder.call(
                    "seed", dag_ids=self.plan.dag_ids, assets=self.plan.assets()
                )
                analyze(self.engine)
                info: dict[str, Any] = {
                    "name": self.target.name,
                    "backend": self.target.backend,
                    "version": self.target.version,
                    "settings": server_settings(self.engine),
                    "phases": phases,
                }
                lap("setup_s")
                if self.plan.sweep:
                    self.sweep()
                    lap("sweep_s")
                if self.plan.contention:
                    self.contention()
                    lap("contention_s")
                self.workers.broadcast(every, "release")
            except BaseException:
                # Stop the workers before the scratch database is dropped: their
                # open transactions would hold DROP DATABASE up (MySQL metadata locks).
                self.workers.close()
                raise
            finally:
                self.engine.dispose()
        lap("teardown_s")
        info["duration_s"] = last - began
        return info

    def sweep(self) -> None:
        sizes, managers = self.plan.sizes, self.plan.managers
        callers = {m: self.workers.group(m)[0] for m in managers}
        for fanout in sizes.fanouts:
            asset = f"adrq_sweep_f{fanout:05d}"
            expected = {(self.asset_ids[asset], d) for d in self.plan.dag_ids[:fanout]}

            def one(
                manager: str, call: int, asset: str = asset, fanout: int = fanout, expected: Rows = expected
            ) -> None:
                clear_queue(self.engine)
                result = callers[manager].call(
                    "sweep_call", asset=asset, run_id=f"{manager}-sweep-f{fanout}-{call}"
                )
                check = _row_check(_queue(self.engine), expected)
                self.raw["sweep"].append(
                    {
                        "db": self.target.name,
                        "fanout": fanout,
                        "manager": manager,
                        "call": call,
                        "warmup": call < 0,
                        **result,
                        "rows_exact": check["missing"] == [] and check["extra"] == [],
                        "check": check,
                    }
                )

            for manager in managers:
                one(manager, -1)
            started = time.monotonic()
            rep = 0
            while rep < sizes.sweep_calls:
                for manager in rotate(managers, rep):
                    one(manager, rep)
                rep += 1
                self.say(f"sweep F={fanout:,}: {rep} call(s) per manager")
                if rep >= sizes.sweep_min_calls and time.monotonic() - started >= sizes.sweep_budget_s:
                    break
        clear_queue(self.engine)

    def contention(self) -> None:
        sizes, plan, workers = self.plan.sizes, self.plan, self.workers
        warm_assets = [a for s in plan.scenarios for a in plan.scenario_assets(s)]
        self.say("contention: warming up every producer (one transaction each)")
        for manager in plan.managers:
            for proc in workers.group(manager):
                proc.call("warmup", assets=warm_assets, run_id=f"warmup-{manager}-{proc.index}")
        for scenario in plan.scenarios:
            assets = plan.scenario_assets(scenario)
            expected = {(self.asset_ids[a], d) for a in assets for d in plan.dag_ids[: sizes.fanout]}
            stopped: set[str] = set()
            for round_no in range(sizes.rounds):
                for manager in [m for m in rotate(plan.managers, round_no) if m not in stopped]:
                    self.say(f"contention {scenario}, round {round_no + 1}/{sizes.rounds}: {manager}")
                    if (
                        not self.round(scenario, assets, expected, round_no, manager)
                        and round_no + 1 < sizes.rounds
                    ):
                        stopped.add(manager)
                        self.raw["skipped"].append(
                            {
                                "db": self.target.name,
                                "scenario": scenario,
                                "manager": manager,
                                "reason": f"round {round_no + 1} ran out of its {sizes.round_budget_s:g} s "
                                "budget; later rounds skipped",
                            }
                        )
        clear_queue(self.engine)

    def round(self, scenario: str, assets: list[str], expected: Rows, round_no: int, manager: str) -> bool:
        """One contention round of ``manager``'s producers; whether every transaction committed."""
        sizes = self.plan.sizes
        clear_queue(self.engine)
        prefix = f"{manager}-{scenario}-r{round_no}-"
        results = self.workers.broadcast(
            self.workers.group(manager),
            "round",
            timeout=sizes.round_budget_s + 600,
            assets=assets,
            run_prefix=prefix,
            transactions=sizes.transactions,
            hold_s=sizes.hold_ms / 1000,
            budget_s=sizes.round_budget_s,
            barrier_timeout_s=120.0,
        )
        txs = [tx for r in results for tx in r["transactions"]]
        committed = sum(1 for tx in txs if tx["ok"])
        check = _row_check(_queue(self.engine), expected if committed else set())
        events = _events(self.engine, prefix)
        self.raw["rounds"].append(
            {
                "db": self.target.name,
                "scenario": scenario,
                "manager": manager,
                "round": round_no,
                "duration_s": max(r["end"] for r in results) - min(r["start"] for r in results),
                "committed": committed,
                "abandoned": len(txs) - committed,
                "events": events,
                "expected_events": committed * len(assets),
                "rows_exact": not check["missing"]
                and not check["extra"]
                and events == committed * len(assets),
                "check": check,
                "transactions": txs,
            }
        )
        return committed == len(txs)
