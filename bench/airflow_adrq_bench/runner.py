"""Run the benchmark end to end: scratch databases, the concurrent rounds, the sweep, the ratio.

The concurrent rounds are the pytest-xdist suite :mod:`.suite` in a subprocess of its own session, one party
of :mod:`.engine` per worker; the parties meet and report through scratch files in the output directory, read
into the result and removed at the end (``pytest.log`` stays after a failure) unless ``keep_scratch``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import airflow_adrq_bench
from airflow_adrq_bench import engine, progress
from airflow_adrq_bench.config import LOST_EVENT_STRATEGIES, SCENARIOS, STRATEGIES, Cell, Plan, Sizes
from airflow_adrq_bench.errors import BenchError as BenchError
from airflow_adrq_testing import dataset
from airflow_adrq_testing import strategies as strategy_registry
from airflow_adrq_testing.dataset import describe as describe

PLAN_ENV = "ADRQ_BENCH_PLAN"
#: Scratch in the output directory (``tx-<party>.jsonl`` too); what stays is
#: ``bench.json``, ``bench.md`` and the PNGs (and ``pytest.log`` after a failure).
SCRATCH = ("barriers", "cells.jsonl", "plan.json", "pytest.ini", "pytest.log")


def deadlock_timeout_s(url: str) -> float:
    """Seconds the server at ``url`` waits in a lock before it looks for a deadlock: PostgreSQL's
    ``deadlock_timeout`` (1 s if unreadable); 0 elsewhere (InnoDB detects deadlocks at once or ends
    them at the lock wait timeout the benchmark sets; SQLite serialises writers)."""
    if sa.engine.make_url(url).get_backend_name() != "postgresql":
        return 0.0
    try:
        with sa.create_engine(url, poolclass=sa.pool.NullPool).connect() as conn:  # no pool to dispose
            ms = conn.scalar(sa.text("SELECT setting FROM pg_settings WHERE name = 'deadlock_timeout'"))
        return float(ms) / 1000
    except (sa.exc.SQLAlchemyError, TypeError, ValueError):
        return 1.0


def _remove_scratch(out_dir: Path, *, failed: bool = False) -> None:
    for path in [out_dir / name for name in SCRATCH] + sorted(out_dir.glob("tx-*.jsonl")):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif not (failed and path.name == "pytest.log"):
            path.unlink(missing_ok=True)


def run(
    targets: Sequence[dataset.Target],
    sizes: Sizes,
    out_dir: Path,
    *,
    strategies: Sequence[str] = STRATEGIES,
    scenarios: Sequence[str] = SCENARIOS,
    keep_scratch: bool = False,
) -> dict[str, Any]:
    """Benchmark every target; returns the raw results (see :mod:`.report`)."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_scratch(out_dir)
    targets = dataset.unique_names(targets)
    failed = True
    try:
        (out_dir / "barriers").mkdir()
        started = time.time()
        with contextlib.ExitStack() as stack:
            databases: list[tuple[str, str]] = []
            for target in targets:
                progress.console.print(f"{target.name}: creating a scratch database and seed data")
                url = stack.enter_context(dataset.scratch_database(target.server_url))
                databases.append((target.name, url))
                seed_engine = dataset.bench_engine(url, lock_timeout_s=sizes.lock_timeout_s)
                try:
                    dataset.seed(
                        seed_engine,
                        fanout=sizes.fanout,
                        outlets=sizes.outlets,
                        paused=sizes.paused,
                        parties=max(sizes.producers, sizes.lost_producers),
                        sweeps=(*sizes.sweep, *sizes.ratio_fanouts),
                        lost_consumers=sizes.lost_consumers,
                    )
                finally:
                    seed_engine.dispose()
            order_seed = int.from_bytes(os.urandom(4), "big")
            cells, skipped = plan_cells(databases, sizes, strategies, scenarios, random.Random(order_seed))
            plan = Plan(out_dir=str(out_dir), sizes=sizes, cells=cells)
            _run_parties(plan)
            sweeps, ratios = {}, {}
            for name, url in databases:
                backend = sa.engine.make_url(url).get_backend_name()
                runnable = [s for s in strategies if strategy_registry.applies_to(s, backend)]
                with progress.task(f"{name}: fan-out sweep", len(runnable) * len(sizes.sweep)) as task:
                    sweeps[name] = engine.run_sweep(url, sizes, runnable, step=task.step)
                with progress.task(f"{name}: raw-SQL ratio", len(sizes.ratio_fanouts)) as task:
                    ratios[name] = engine.run_raw_ratio(url, sizes, step=task.step)
        parties = range(1, plan.parties)
        raw = {
            "started_at": started,
            "duration_s": time.time() - started,
            "sizes": dataclasses.asdict(sizes),
            "targets": [{"name": t.name, "version": t.version} for t in targets],
            "cells": engine.read_jsonl(out_dir / "cells.jsonl"),
            "transactions": [tx for p in parties for tx in engine.read_jsonl(out_dir / f"tx-{p}.jsonl")],
            "sweeps": sweeps,
            "raw_sql_ratio": ratios,
            "skipped": skipped,
            "cell_order_seed": order_seed,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        }
        failed = False
    finally:
        if not keep_scratch:
            _remove_scratch(out_dir, failed=failed)
    return raw


#: Why ``values_batch`` is not run on a backend (see :func:`airflow_adrq_testing.strategies.applies_to`).
VALUES_BATCH_NOTE = (
    "values_batch is apache/airflow PR #69977, which changed the MySQL/MariaDB branch only; "
    "on this backend it is airflow_3_3's code, so it is not run here"
)


def plan_cells(
    databases: Sequence[tuple[str, str]],
    sizes: Sizes,
    strategies: Sequence[str],
    scenarios: Sequence[str],
    rng: random.Random,
) -> tuple[tuple[Cell, ...], list[dict[str, str]]]:
    """Every round of the run, in random order within each database (the ``single`` rounds together);
    and what was left out, why.
    ``lost_events`` runs the selected :data:`LOST_EVENT_STRATEGIES` once per hold of ``lost_holds_ms``."""
    cells: list[Cell] = []
    skipped: list[dict[str, str]] = []
    for db, url in databases:
        backend = sa.engine.make_url(url).get_backend_name()
        runnable = [s for s in strategies if strategy_registry.applies_to(s, backend)]
        skipped += [
            {"db": db, "strategy": s, "reason": VALUES_BATCH_NOTE} for s in strategies if s not in runnable
        ]
        todo: list[tuple[str, str, int, float, int]] = []
        for scenario in scenarios:
            if scenario == "lost_events":
                lost = [s for s in runnable if s in LOST_EVENT_STRATEGIES]
                todo += [(s, scenario, 0, h, sizes.lost_producers) for s in lost for h in sizes.lost_holds_ms]
            else:
                rounds = range(sizes.rounds)
                todo += [(s, scenario, r, sizes.hold_ms, sizes.producers) for s in runnable for r in rounds]
        rng.shuffle(todo)
        cells += [Cell(len(cells) + k, db, url, *cell) for k, cell in enumerate(_single_together(todo))]
    return tuple(cells), skipped


def _single_together(todo: list[tuple[str, str, int, float, int]]) -> list[tuple[str, str, int, float, int]]:
    """``todo`` with its ``single`` rounds one after the other, where the first of them was, in their
    random order: the verdict compares their tx/s across strategies, and another process's load, which
    comes and goes over seconds, then falls on all of them alike rather than on one."""
    single = [t for t in todo if t[1] == "single"]
    if not single:
        return todo
    first, rest = todo.index(single[0]), [t for t in todo if t[1] != "single"]
    return rest[:first] + single + rest[first:]


def _run_parties(plan: Plan) -> None:
    """The suite under pytest-xdist until the last round ends; a step of progress per round."""
    out = Path(plan.out_dir)
    (out / "plan.json").write_text(json.dumps(dataclasses.asdict(plan), indent=2))
    (out / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "airflow_adrq_bench.suite", "-n", str(plan.parties)]
    cmd += ["-c", "pytest.ini", "--rootdir", str(out), "-p", "xdist", "-p", "no:cacheprovider", "-q", "-x"]
    # Only xdist: other installed plug-ins (the test support's fixtures, say) cost start-up time.
    env = {**os.environ, PLAN_ENV: str(out / "plan.json"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    # The workers must run the code this process runs: its copy of the package first on the path.
    root = str(Path(airflow_adrq_bench.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    log_path = out / "pytest.log"
    with progress.task("concurrent rounds", len(plan.cells)) as task, log_path.open("w") as log:
        # A session of its own: on any failure (Ctrl-C included) the suite and its workers are
        # stopped before the scratch databases go.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True
        )
        shown = 0
        try:
            while proc.poll() is None:
                while shown < len(plan.cells) and engine.cell_started(out / "barriers", shown):
                    task.step(plan.cells[shown].label, advance=1)
                    shown += 1
                time.sleep(0.25)
        finally:
            # Stop the suite's process group if it is still running (SIGTERM, then SIGKILL).
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10.0)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise BenchError(f"the benchmark suite failed (exit {proc.returncode}); see {log_path}:\n{tail}")
