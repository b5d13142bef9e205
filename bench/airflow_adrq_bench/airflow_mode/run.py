"""Run the Airflow mode end to end; the controller (this process) never imports Airflow.

The workers (:class:`.worker.Workers`) start while ``airflow db migrate`` makes each scratch database
(:meth:`Controller.run`); then per database the workers' ORM is pointed at it, DAGs, assets and schedule
references are seeded through Airflow's models, ``ANALYZE`` runs, and it measures:

1. the sweep: per fan-out one warm-up call per manager, then calls interleaved between the managers
   (the order rotating), each from an empty queue and followed by an exact-rows check;
2. contention: per scenario and round (managers interleaved), the manager's producers start together on
   an empty queue, each running ``transactions`` transactions; then the queue must hold exactly the
   expected rows and ``asset_event`` one row per committed outlet; transactions still open are ended."""

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
from airflow_adrq_bench.airflow_mode import databases, processes, worker
from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, AccountingSizes, Sizes, StandbySizes
from airflow_adrq_bench.airflow_mode.report import raw_finish, raw_opening
from airflow_adrq_testing import dataset


def _row_check(engine: sa.Engine, expected: set[dataset.Pair]) -> dict[str, Any]:
    """How the queue's rows differ from ``expected`` (up to 5 examples each way)."""
    with engine.connect() as conn:
        actual = dataset.queued_pairs(conn)
    missing, extra = sorted(expected - actual)[:5], sorted(actual - expected)[:5]
    return dict(
        expected=len(expected), actual=len(actual), missing=missing, extra=extra, exact=actual == expected
    )


class Controller:
    """What the ``--airflow`` and ``--accounting`` controllers share: the module docstring's steps, except
    what is seeded and measured (:meth:`measure`), and each database's description in ``raw["targets"]``.
    A subclass sets ``sizes``, ``managers``, ``raw`` (with ``targets``), ``steps`` (progress per database)."""

    sizes: Sizes | AccountingSizes | StandbySizes
    managers: Sequence[str]
    raw: dict[str, Any]
    pg_deadlock_timeout_ms: int | None = None
    #: The start-up's progress title.
    starting = "starting Airflow worker processes"
    steps: int

    def run(self, targets: Sequence[databases.Target]) -> dict[str, Any]:
        """Measure on every target; returns ``raw``, finished (:func:`.report.raw_finish`)."""
        started = time.monotonic()
        with contextlib.ExitStack() as stack:  # on exit: the workers closed, the scratch databases dropped
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="adrq-airflow-")))
            migrating = []
            for n, target in enumerate(targets):  # migrated in the background while the workers start
                url = databases.airflow_url(stack.enter_context(dataset.scratch_database(target.server_url)))
                env = processes.clean_environ(processes.airflow_settings(home, url))
                log = home / f"db-migrate-{n}.log"
                proc = processes.start_migrate(env, log)
                stack.callback(proc.kill)
                migrating.append((target, url, proc, log))
            with progress.task(self.starting, len(self.managers) * self.sizes.producers) as bar:
                bar.step("each imports Airflow: about 3 s of CPU apiece")
                self.start(stack, home, bar)
            self.raw |= {"workers": self.workers.info, "airflow_version": self.workers.info[0]["airflow"]}
            for target, url, proc, log in migrating:
                with progress.task(target.version, self.steps) as bar:
                    bar.step("airflow db migrate on a scratch database")
                    processes.wait_migrate(proc, log, label=f"{target.version}: ")
                    self.raw["targets"].append(self.measure_on(target, url, bar))
        raw_finish(self.raw, started)
        return self.raw

    def start(self, stack: contextlib.ExitStack, home: Path, bar: progress.Task) -> None:
        """Start the workers (a step of ``bar`` each), closed before the scratch databases are dropped."""
        self.workers = worker.Workers(self.managers, self.sizes.producers, home, lambda: bar.step("", 1))
        stack.callback(processes.close_all, self.workers.procs.values())  # their connections end with them

    def measure_on(self, target: databases.Target, url: str, bar: progress.Task) -> dict[str, Any]:
        """:meth:`measure` on ``target`` (at ``url``), with the workers pointed at it; its description."""
        self.target, self.bar = target, bar
        began, every = time.monotonic(), list(self.workers.procs.values())
        self.engine = databases.control_engine(url)
        try:
            self.workers.broadcast(
                every, worker.target, url=url, pg_deadlock_timeout_ms=self.pg_deadlock_timeout_ms
            )
            found = self.measure(url)
            self.workers.broadcast(every, worker.release)
            settings = databases.server_settings(self.engine)
        finally:
            self.engine.dispose()
        described = {"name": target.name, "backend": target.backend, "version": target.version}
        return described | found | {"settings": settings, "duration_s": time.monotonic() - began}

    def measure(self, url: str) -> dict[str, Any]:
        """Measure on ``self.target`` (progress on ``self.bar``); more of its description."""
        raise NotImplementedError


@dataclass
class Bench(Controller):
    """What a run measures; :meth:`run` measures it on every target, returning the raw results."""

    sizes: Sizes
    managers: list[str]
    scenarios: list[str]
    sweep: bool = True
    contention: bool = True
    pg_deadlock_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        sizes = self.sizes
        self.dag_ids = [f"adrq_bench_c{i:04d}" for i in range(max(*sizes.fanouts, sizes.fanout))]
        self.sweep_assets = {f: f"adrq_sweep_f{f:05d}" for f in sizes.fanouts}
        # Every scenario's assets are seeded, whichever scenarios run.
        multi = [f"adrq_multi_{i}" for i in range(sizes.outlets)]
        self.assets_of = {"single": ["adrq_single"], "multi_outlet": multi}
        self.raw = {
            **raw_opening("airflow-adrq bench --airflow", sizes, self.managers),
            "manager_classes": {m: MANAGER_CLASSES[m] for m in self.managers},
            "scenarios": self.scenarios,
            **{records: [] for records in ("targets", "sweep", "rounds", "skipped")},
        }
        # Progress steps per database: the set-up, the sweep's calls, the contention rounds.
        calls = len(sizes.fanouts) * (sizes.sweep_calls + 1) if self.sweep else 0
        rounds = len(self.scenarios) * sizes.rounds if self.contention else 0
        self.steps = 1 + (calls + rounds) * len(self.managers)

    def measure(self, url: str) -> dict[str, Any]:
        assets = {name: f for f, name in self.sweep_assets.items()}
        assets |= {a: self.sizes.fanout for names in self.assets_of.values() for a in names}
        seeder = self.workers.group(self.managers[0])[0]
        self.asset_ids: dict[str, int] = seeder.call(worker.seed, dag_ids=self.dag_ids, assets=assets)
        databases.analyze(self.engine)
        self.bar.step("seeded", 1)
        if self.sweep:
            self.one_caller()
        if self.contention:
            self.contend()
        return {}

    def one_caller(self) -> None:
        sizes, managers = self.sizes, self.managers
        for fanout in sizes.fanouts:
            for manager in managers:
                self.sweep_call(manager, fanout, -1)
            started = time.monotonic()
            for rep in range(sizes.sweep_calls):
                for manager in databases.rotate(managers, rep):
                    self.sweep_call(manager, fanout, rep)
                if rep + 1 >= sizes.sweep_min_calls and time.monotonic() - started >= sizes.sweep_budget_s:
                    left = (sizes.sweep_calls - rep - 1) * len(managers)
                    self.bar.step(f"F={fanout:,}: {sizes.sweep_budget_s:g} s budget spent", left)
                    break
        databases.clear_queue(self.engine)

    def sweep_call(self, manager: str, fanout: int, call: int) -> None:
        """One call by ``manager``'s first producer (-1: its warm-up), from an empty queue; rows checked."""
        asset = self.sweep_assets[fanout]
        databases.clear_queue(self.engine)
        self.bar.step(f"one caller, F={fanout:,}: {manager}, call {call + 1}", 1)
        caller = self.workers.group(manager)[0]
        result = caller.call(worker.sweep_call, asset=asset, run_id=f"{manager}-sweep-f{fanout}-{call}")
        check = _row_check(self.engine, {(self.asset_ids[asset], d) for d in self.dag_ids[:fanout]})
        where = {"db": self.target.name, "fanout": fanout, "manager": manager, "call": call}
        found = {"warmup": call < 0, "rows_exact": check["exact"], "check": check}
        self.raw["sweep"].append(where | result | found)

    def contend(self) -> None:
        sizes = self.sizes
        warm = [a for s in self.scenarios for a in self.assets_of[s]]
        self.bar.step("contention: warming up every producer (one transaction each)")
        for manager in self.managers:
            group = self.workers.group(manager)
            self.workers.broadcast(group, worker.warmup, assets=warm, run_id=f"warmup-{manager}")
        for scenario in self.scenarios:
            stopped: set[str] = set()
            for round_no in range(sizes.rounds):
                for manager in databases.rotate(self.managers, round_no):
                    if manager in stopped:
                        self.bar.step(f"{scenario}: {manager} skipped", 1)
                        continue
                    self.bar.step(f"contention {scenario}, round {round_no + 1}/{sizes.rounds}: {manager}", 1)
                    if not self.round(scenario, round_no, manager) and round_no + 1 < sizes.rounds:
                        stopped.add(manager)
                        reason = f"round {round_no + 1} ran out of its {sizes.round_budget_s:g} s budget"
                        where = {"db": self.target.name, "scenario": scenario, "manager": manager}
                        self.raw["skipped"].append(where | {"reason": reason})
        databases.clear_queue(self.engine)

    def round(self, scenario: str, round_no: int, manager: str) -> bool:
        """One contention round of ``manager``'s producers; whether every transaction committed."""
        sizes, assets = self.sizes, self.assets_of[scenario]
        databases.clear_queue(self.engine)
        prefix = f"{manager}-{scenario}-r{round_no}-"
        round_of = dict(assets=assets, run_prefix=prefix, transactions=sizes.transactions)
        round_of |= dict(hold_s=sizes.hold_ms / 1000, budget_s=sizes.round_budget_s)
        group, timeout = self.workers.group(manager), sizes.round_budget_s + 600
        results = self.workers.broadcast(group, worker.round_of, timeout, **round_of)
        ended = databases.end_transactions(self.engine)  # nothing of this round may hold rows into the next
        txs = [tx for r in results for tx in r["transactions"]]
        committed = sum(1 for tx in txs if tx["ok"])
        expected = {(self.asset_ids[a], d) for a in assets for d in self.dag_ids[: sizes.fanout]}
        check = _row_check(self.engine, expected if committed else set())
        with self.engine.connect() as conn:
            sql = sa.text("SELECT count(*) FROM asset_event WHERE source_run_id LIKE :p")
            events = int(conn.execute(sql, {"p": f"{prefix}%"}).scalar_one())
        where = {"db": self.target.name, "scenario": scenario, "manager": manager, "round": round_no}
        duration = max(r["end"] for r in results) - min(r["start"] for r in results)
        counts = {"duration_s": duration, "committed": committed, "abandoned": len(txs) - committed}
        found = {"ended_transactions": ended, "events": events, "expected_events": committed * len(assets)}
        exact = check["exact"] and events == found["expected_events"]
        self.raw["rounds"].append(
            where | counts | found | {"rows_exact": exact, "check": check, "transactions": txs}
        )
        return committed == len(txs)
