"""The controller: scratch databases, producers and the consumer per cell, the counts (imports no Airflow)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_adrq_bench import progress
from airflow_adrq_bench.airflow_mode import worker
from airflow_adrq_bench.airflow_mode.accounting import consumer
from airflow_adrq_bench.airflow_mode.accounting.classify import classify
from airflow_adrq_bench.airflow_mode.accounting.consumer import Consumer
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN, AccountingSizes
from airflow_adrq_bench.airflow_mode.databases import (
    Target,
    analyze,
    clear_queue,
    control_engine,
    each_ready,
    fetch,
    latest_deadlock,
    migrated,
    rotate,
    server_settings,
)
from airflow_adrq_bench.airflow_mode.processes import close_all
from airflow_adrq_bench.airflow_mode.results import raw_finish, raw_opening
from airflow_adrq_bench.airflow_mode.worker import Workers
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.verdict import Line, line
from airflow_adrq_bench.verdict import Target as Goal

WARM_ASSET = "adrq_acct_warm"


@dataclass(frozen=True)
class _Cell:
    """One cell: a hold, a shape, a manager, and its consumer DAGs. ``fan_out``: every producer emits one
    asset, ``consumers`` DAGs are scheduled on it; ``fan_in``: producer ``i`` emits ``{name}_p{i}``, one
    DAG is scheduled on any of them."""

    hold_ms: float
    shape: str
    manager: str
    name: str
    schedules: dict[str, list[str]]  # consumer DAG -> the assets it is scheduled on (any of them)

    def assets(self) -> list[str]:
        return sorted({a for assets in self.schedules.values() for a in assets})


def _cells(sizes: AccountingSizes, managers: Sequence[str]) -> list[_Cell]:
    cells = []
    for h, hold_ms in enumerate(sizes.holds_ms):  # the managers take turns at going first
        for shape in ("fan_out", "fan_in") if sizes.fan_in else ("fan_out",):
            for manager in rotate(managers, h):
                name = f"adrq_acct_h{h}_{shape}_{manager}"
                if shape == "fan_out":
                    schedules = {f"{name}_c{k}": [name] for k in range(sizes.consumers)}
                else:
                    schedules = {f"{name}_c": [f"{name}_p{i}" for i in range(sizes.producers)]}
                cells.append(_Cell(hold_ms, shape, manager, name, schedules))
    return cells


def run(
    targets: Sequence[Target], sizes: AccountingSizes, *, managers: Sequence[str] = STOCK_AND_PLUGIN
) -> dict[str, Any]:
    """Run every cell on every target; returns the raw results (``cells``, the cells' ``problems`` ...)."""
    started = time.monotonic()
    raw: dict[str, Any] = {
        **raw_opening("airflow-adrq bench --airflow --accounting", sizes, managers),
        "targets": [],
        "cells": [],
        "problems": [],
    }
    _Accounting(sizes, _cells(sizes, managers), raw).run(targets, managers)
    raw_finish(raw, started)
    return raw


@dataclass
class _Accounting:
    """The cells, on the producers and the consumer; then, per target, its set-up and every cell."""

    sizes: AccountingSizes
    cells: list[_Cell]
    raw: dict[str, Any]

    def run(self, targets: Sequence[Target], managers: Sequence[str]) -> None:
        sizes = self.sizes
        with (
            tempfile.TemporaryDirectory(prefix="adrq-airflow-accounting-") as home,
            contextlib.ExitStack() as stack,
        ):
            databases = stack.enter_context(migrated(targets, Path(home)))
            with progress.task(
                "starting the consumer and the producers", len(managers) * sizes.producers + 1
            ) as bar:
                bar.step("each imports Airflow")
                self.consumer = Consumer(Path(home))
                stack.callback(close_all, [self.consumer])
                self.workers = Workers(managers, sizes.producers, Path(home), started=lambda: bar.step("", 1))
                stack.callback(self.workers.close)  # before the scratch databases are dropped
                self.raw["consumer"] = {"pid": self.consumer.started()}
                bar.step("", 1)
            self.raw["workers"] = self.workers.info
            self.raw["airflow_version"] = self.workers.info[0]["airflow"]
            for target, url, bar in each_ready(databases, len(self.cells) + 1):
                self.raw["targets"].append(self.measure(target, url, bar))

    def measure(self, target: Target, url: str, bar: progress.Task) -> dict[str, Any]:
        began, every = time.monotonic(), list(self.workers.procs.values())
        self.engine = control_engine(url)
        try:
            self.workers.broadcast(every, worker.target, url=url)
            dialect = self.consumer.call(consumer.target, url)
            schedules = {f"{WARM_ASSET}_c{k}": [WARM_ASSET] for k in range(self.sizes.consumers)}
            for cell in self.cells:
                schedules.update(cell.schedules)
            self.asset_ids: dict[str, int] = self.consumer.call(consumer.seed, schedules, worker.PRODUCER_DAG)
            analyze(self.engine)
            bar.step("warming up every producer (one transaction each)", 1)
            for (manager, index), proc in self.workers.procs.items():
                if not proc.call(worker.warmup, assets=[WARM_ASSET], run_id=f"warmup-{manager}-{index}"):
                    raise BenchError(f"{target.version}: warm-up of {manager}/{index} failed")
            clear_queue(self.engine)
            for cell in self.cells:
                where = f"hold {cell.hold_ms:g} ms {cell.shape} {cell.manager}"
                bar.step(where, 1)
                found = {"db": target.name, "version": target.version} | self.cell(cell)
                self.raw["cells"].append(found)
                self.raw["problems"] += [f"{target.name} {where}: {p}" for p in found["problems"]]
            self.workers.broadcast(every, worker.release)
            self.consumer.call(consumer.release)
            settings = server_settings(self.engine)
        finally:
            self.engine.dispose()
        described = {"name": target.name, "backend": target.backend, "version": target.version}
        return described | {"dialect": dialect, "settings": settings, "duration_s": time.monotonic() - began}

    def cell(self, cell: _Cell) -> dict[str, Any]:
        """One cell: the producers' round while the consumer passes, the sentinel, the drain; the counts."""
        sizes, engine, the_consumer = self.sizes, self.engine, self.consumer
        dags = list(cell.schedules)
        prefix, sentinel_run = f"acct-{cell.name}-", f"sentinel-{cell.name}"
        producers = self.workers.group(cell.manager)
        start = time.monotonic()
        results, consumed_run = the_consumer.consume_during(
            dags,
            sizes.consumer_pause_ms / 1000,
            lambda: self.workers.broadcast(
                producers,
                worker.round_of,
                timeout=sizes.budget_s + 600,
                assets=[cell.name],
                run_prefix=prefix,
                transactions=sizes.transactions,
                hold_s=cell.hold_ms / 1000,
                budget_s=sizes.budget_s,
                own_asset=cell.shape == "fan_in",
            ),
        )
        duration = time.monotonic() - start
        with engine.connect() as conn:
            cutoff = int(conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM dag_run")).scalar_one())
        sentinel = producers[0].call(worker.warmup, assets=cell.assets()[:1], run_id=sentinel_run)
        drained = the_consumer.call(consumer.drain, dags)

        txs = [tx for r in results for tx in r["transactions"]]
        committed = sum(1 for tx in txs if tx["ok"])
        not_started = sum(1 for tx in txs if not tx["ok"] and tx["attempts"] == 0)
        producer_failures: Counter[str] = Counter()
        for tx in txs:
            producer_failures.update(tx["failures"])
        with engine.connect() as conn:
            ids = [self.asset_ids[a] for a in cell.assets()]
            rows = fetch(conn, "SELECT id, source_run_id FROM asset_event WHERE asset_id IN :ids", ids=ids)
            consumed = fetch(
                conn,
                "SELECT r.id, r.dag_id, e.event_id FROM dag_run r "
                "JOIN dagrun_asset_event e ON e.dag_run_id = r.id WHERE r.dag_id IN :dags",
                dags=dags,
            )
            runs = fetch(conn, "SELECT id, run_type FROM dag_run WHERE dag_id IN :dags", dags=dags)
            deadlock = latest_deadlock(conn)
        events = [e for e, run_id in rows if run_id.startswith(prefix)]
        sentinels = [e for e, run_id in rows if run_id == sentinel_run]
        strays = [e for e, run_id in rows if not run_id.startswith(prefix) and run_id != sentinel_run]
        sentinel_id = sentinels[0] if len(sentinels) == 1 else None
        classes = classify(
            events, dags, [(int(r), str(d), int(e)) for r, d, e in consumed], cutoff, sentinel_id
        )

        problems = []
        if len(events) != committed:
            problems.append(f"{len(events)} events in the database, {committed} committed transactions")
        if strays:
            problems.append(
                f"{len(strays)} events of the cell's assets from neither the round nor the sentinel"
            )
        if not classes.classes_add_up or classes.pairs != committed * len(dags):
            problems.append(
                f"classes do not add up: {classes.consumed} + {classes.late} + {classes.unconsumed} events "
                f"of {classes.events}; {classes.pairs} pairs for {committed} committed x {len(dags)} DAGs"
            )
        if classes.unknown:
            problems.append(f"runs of the cell's DAGs consumed {classes.unknown} pairs of unknown events")
        if not sentinel or sentinel_id is None:
            problems.append(f"the sentinel was not committed exactly once ({len(sentinels)} events)")
        elif classes.sentinel_consumers != len(dags):
            problems.append(
                f"{classes.sentinel_consumers} of {len(dags)} consumer DAGs consumed the sentinel"
            )
        left = consumed_run["drain"]["queue_rows_left"] + drained["queue_rows_left"]
        if left:
            problems.append(f"{left} queue rows left after the drains")
        bad_types = [t for _, t in runs if t != "asset_triggered"]
        if bad_types:
            problems.append(f"{len(bad_types)} runs not asset-triggered: {sorted(set(bad_types))}")
        return {
            "manager": cell.manager,
            "hold_ms": cell.hold_ms,
            "shape": cell.shape,
            "producers": len(producers),
            "planned": len(txs),
            "committed": committed,
            "gave_up": len(txs) - committed - not_started,
            "not_started": not_started,
            "producer_failures": dict(producer_failures),
            "consumers": len(dags),
            **dataclasses.asdict(classes),
            "runs": len(runs),
            "runs_before_sentinel": sum(1 for r, _ in runs if r <= cutoff),
            "duration_s": duration,
            "consumer_passes": consumed_run["passes"],
            "pass_p50_ms": consumed_run["pass_p50_ms"],
            "pass_max_ms": consumed_run["pass_max_ms"],
            "consumer_failures": dict(
                Counter(consumed_run["failures"])
                + Counter(consumed_run["drain"]["failures"])
                + Counter(drained["failures"])
            ),
            "consumer_db_errors": consumed_run["db_errors"],
            "drain_passes": consumed_run["drain"]["passes"] + drained["passes"],
            "latest_deadlock": deadlock or None,
            "queue_rows_left": left,
            "problems": problems,
        }


#: The plug-in leaves no more events unconsumed than stock at the same hold (the value: how many more).
UNCONSUMED = Goal("events unconsumed, vs stock", "<= stock", lambda more: more <= 0)
TWICE = Goal("pairs consumed twice", "0", lambda pairs: pairs == 0)


def verdict(cells: Sequence[dict[str, Any]]) -> list[Line]:
    """Per database, hold and shape: the plug-in's unconsumed events against stock's, its pairs consumed
    twice."""
    by_key: dict[tuple[str, float, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for cell in cells:
        by_key[(cell["db"], cell["hold_ms"], cell.get("shape", "fan_out"))][cell["manager"]] = cell
    lines = []
    for (db, hold, shape), managers in by_key.items():
        where = f"{hold:g} ms" + (", fan-in" if shape == "fan_in" else "")
        if "plugin" not in managers:
            continue
        plugin = managers["plugin"]
        if "stock" in managers:
            mine, theirs = plugin["unconsumed"], managers["stock"]["unconsumed"]
            what = f"{UNCONSUMED.what}, {where}"
            lines.append(line(db, UNCONSUMED, mine - theirs, f"{mine} vs {theirs}", what))
        twice = plugin["duplicate_pairs"]
        lines.append(line(db, TWICE, twice, f"{twice}", f"{TWICE.what}, {where}"))
    return lines
