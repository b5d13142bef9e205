"""Run the benchmark end to end: scratch databases, the xdist suite, the sweep, the report.

The concurrent part runs as ``python -m pytest --pyargs
airflow_adrq_bench.suite -n <producers + 1>`` in a subprocess (so it works
from an installed wheel), with its output in ``<out>/pytest.log``; this
process shows one progress line per round as the coordinator starts it.

The processes meet and report through scratch files in the output
directory (:data:`SCRATCH`: the barriers, the plan, the records); :func:`run`
reads the records into its result and removes the scratch files at the end,
on failure too, unless ``keep_scratch``. On failure ``pytest.log`` stays
(the error names it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import airflow_adrq
from airflow_adrq_bench import engine
from airflow_adrq_bench.config import LOST_EVENT_STRATEGIES, SCENARIOS, STRATEGIES, Cell, Plan, Sizes
from airflow_adrq_bench.errors import BenchError as BenchError
from airflow_adrq_testing import dataset
from airflow_adrq_testing import strategies as strategy_registry
from airflow_adrq_testing.dataset import Target
from airflow_adrq_testing.dataset import describe as describe

SUITE = "airflow_adrq_bench.suite"
PLAN_ENV = "ADRQ_BENCH_PLAN"

#: Scratch in the output directory (``tx-<party>.jsonl`` too); what stays is
#: ``bench.json``, ``bench.md`` and the PNGs (and ``pytest.log`` after a failure).
SCRATCH = ("barriers", "cells.jsonl", "plan.json", "pytest.ini", "pytest.log")


def deadlock_timeout_s(url: str) -> float:
    """Seconds the server at ``url`` waits in a lock before it looks for a deadlock.

    PostgreSQL: ``deadlock_timeout`` (1 s assumed if it cannot be read).
    MySQL/MariaDB: 0 when InnoDB detects deadlocks at once
    (``innodb_deadlock_detect``, the default); with detection off a deadlock
    ends only at the lock wait timeout, which the benchmark sets itself, so
    0 as well. SQLite: 0 (writers are serialised).
    """
    if sa.engine.make_url(url).get_backend_name() != "postgresql":
        return 0.0
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            ms = conn.scalar(sa.text("SELECT setting FROM pg_settings WHERE name = 'deadlock_timeout'"))
        return float(ms) / 1000
    except (sa.exc.SQLAlchemyError, TypeError, ValueError):
        return 1.0
    finally:
        engine.dispose()


def scratch_paths(out_dir: Path) -> list[Path]:
    """The scratch files and directories of a run present in ``out_dir``."""
    paths = [out_dir / name for name in SCRATCH] + sorted(out_dir.glob("tx-*.jsonl"))
    return [p for p in paths if p.exists()]


def _remove_scratch(out_dir: Path, *, failed: bool) -> None:
    for path in scratch_paths(out_dir):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif not (failed and path.name == "pytest.log"):
            path.unlink(missing_ok=True)


def run(
    targets: Sequence[Target],
    sizes: Sizes,
    out_dir: Path,
    *,
    strategies: Sequence[str] = STRATEGIES,
    scenarios: Sequence[str] = SCENARIOS,
    progress: Callable[[str], None] = lambda _msg: None,
    keep_scratch: bool = False,
) -> dict[str, Any]:
    """Benchmark every target; returns the raw results (see :mod:`.report`).

    The scratch files (:func:`scratch_paths`) are removed before returning
    or raising, unless ``keep_scratch``.
    """
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_scratch(out_dir, failed=False)
    failed = True
    try:
        raw = _run(dataset.unique_names(targets), sizes, out_dir, strategies, scenarios, progress)
        failed = False
        return raw
    finally:
        if not keep_scratch:
            _remove_scratch(out_dir, failed=failed)


def _run(
    targets: Sequence[Target],
    sizes: Sizes,
    out_dir: Path,
    strategies: Sequence[str],
    scenarios: Sequence[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    (out_dir / "barriers").mkdir()
    started = time.time()
    with contextlib.ExitStack() as stack:
        scratch: dict[str, str] = {}
        for target in targets:
            progress(f"{target.name}: creating a scratch database and seed data")
            scratch[target.name] = stack.enter_context(dataset.scratch_database(target.server_url))
            seed_engine = dataset.bench_engine(scratch[target.name], lock_timeout_s=sizes.lock_timeout_s)
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
        databases = list(scratch.items())
        cells, skipped = plan_cells(databases, sizes, strategies, scenarios, random.Random(order_seed))
        plan = Plan(out_dir=str(out_dir), sizes=sizes, cells=cells)
        plan.dump(out_dir / "plan.json")
        _run_suite(plan, out_dir / "plan.json", progress)
        sweeps: dict[str, list[dict[str, Any]]] = {}
        ratios: dict[str, list[dict[str, Any]]] = {}
        for name, url in databases:
            backend = sa.engine.make_url(url).get_backend_name()
            runnable = [s for s in strategies if strategy_registry.applies_to(s, backend)]
            say = functools.partial(_prefixed, progress, name)
            sweeps[name] = engine.run_sweep(url, sizes, runnable, progress=say)
            ratios[name] = engine.run_raw_ratio(url, sizes, progress=say)
    transactions = [tx for p in range(1, plan.parties) for tx in _read_jsonl(out_dir / f"tx-{p}.jsonl")]
    return {
        "started_at": started,
        "duration_s": time.time() - started,
        "sizes": dataclasses.asdict(sizes),
        "targets": [{"name": t.name, "version": t.version} for t in targets],
        "cells": _read_jsonl(out_dir / "cells.jsonl"),
        "transactions": transactions,
        "sweeps": sweeps,
        "raw_sql_ratio": ratios,
        "skipped": skipped,
        "cell_order_seed": order_seed,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


def _prefixed(progress: Callable[[str], None], name: str, msg: str) -> None:
    progress(f"{name}: {msg}")


#: Why ``values_batch`` is not run on a backend (see :func:`airflow_adrq_testing.baselines.applies_to`).
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
    """Every round of the run, in random order within each database; and what was left out, why.

    Contention scenarios: every strategy that applies to the backend,
    ``rounds`` times, with ``sizes.producers`` producers. ``lost_events``: the
    strategies of :data:`LOST_EVENT_STRATEGIES` that were selected, once per
    hold in ``sizes.lost_holds_ms``, with ``sizes.lost_producers`` producers.
    """
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
                todo += [
                    (s, scenario, 0, hold, sizes.lost_producers) for s in lost for hold in sizes.lost_holds_ms
                ]
            else:
                rounds = range(sizes.rounds)
                todo += [(s, scenario, r, sizes.hold_ms, sizes.producers) for s in runnable for r in rounds]
        rng.shuffle(todo)
        cells += [Cell(len(cells) + k, db, url, *cell) for k, cell in enumerate(todo)]
    return tuple(cells), skipped


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_suite(plan: Plan, plan_path: Path, progress: Callable[[str], None]) -> None:
    out = Path(plan.out_dir)
    ini = out / "pytest.ini"
    ini.write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "--pyargs", SUITE, "-n", str(plan.parties), "-c", str(ini)]
    cmd += ["--rootdir", str(out), "-p", "xdist", "-p", "no:cacheprovider", "-q", "-x"]
    # Run from the output directory with this process's copy of the package
    # first on the path: the workers must run the code the controller runs.
    package_root = str(Path(airflow_adrq.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    # Only xdist: other installed plugins (pytest-randomly reseeding, database
    # fixtures, benchmark timers) cost start-up time or get in the way.
    env = {**os.environ, PLAN_ENV: str(plan_path), "PYTHONPATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    log_path = out / "pytest.log"
    shown = 0
    progress(f"starting {plan.parties} processes ({plan.parties - 1} producers and a coordinator)")
    with log_path.open("w") as log:
        # A session of its own, so that on any failure (Ctrl-C included) the
        # suite and its workers are stopped before the scratch databases go.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out, start_new_session=True
        )
        try:
            while proc.poll() is None:
                started = shown
                while started < len(plan.cells) and engine.cell_started(out / "barriers", started):
                    started += 1
                for line in progress_lines(plan.cells, shown, started):
                    progress(line)
                shown = started
                time.sleep(0.25)
        finally:
            _stop(proc)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise BenchError(f"the benchmark suite failed (exit {proc.returncode}); see {log_path}:\n{tail}")
    # Rounds that started and ended between two polls.
    for line in progress_lines(plan.cells, shown, len(plan.cells)):
        progress(line)
    progress(f"{len(plan.cells)} concurrent rounds done")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the suite's process group if it is still running (SIGTERM, then SIGKILL)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10.0)


def progress_lines(cells: Sequence[Cell], shown: int, started: int) -> list[str]:
    """``[k/N] <round>`` for rounds ``shown+1 .. started`` (1-based): each round once, in order."""
    total = len(cells)
    return [f"[{k + 1:>{len(str(total))}}/{total}] {round_label(cells[k])}" for k in range(shown, started)]


def round_label(cell: Cell) -> str:
    """How a progress line names a round."""
    if cell.scenario == "lost_events":
        return f"{cell.db} lost_events/{cell.strategy} (hold {cell.hold_ms:g} ms)"
    return f"{cell.db} {cell.scenario}/{cell.strategy} (round {cell.round + 1})"
