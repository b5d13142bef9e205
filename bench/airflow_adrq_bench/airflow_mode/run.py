"""Run the Airflow mode end to end: worker processes, scratch databases, sweep, contention.

The controller (this process) never imports Airflow. It spawns
``producers`` worker processes per manager (:mod:`.worker`; the first of each
also makes the single-caller calls), and for every database:

1. creates a scratch database (a temporary file for SQLite) and runs
   ``airflow db migrate`` on it in a subprocess with a private
   ``AIRFLOW_HOME``; it is dropped afterwards, whatever happens;
2. points every worker's Airflow ORM at it, seeds DAGs, assets and
   schedule references through Airflow's models, and runs ``ANALYZE``;
3. the sweep: for each fan-out, one warm-up call per manager, then calls
   interleaved between the managers (the order rotates every repetition),
   each from an empty queue, each followed by an exact-rows check;
4. contention: per scenario and round (managers interleaved), the queue is
   emptied, the manager's producers start together and each runs
   ``transactions`` transactions; afterwards the queue must hold exactly the
   expected rows and ``asset_event`` exactly one row per committed outlet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from airflow_adrq_bench import servers
from airflow_adrq_bench.airflow_mode import rawinfo
from airflow_adrq_bench.airflow_mode import worker as worker_module
from airflow_adrq_bench.airflow_mode.config import MANAGER_CLASSES, Sizes
from airflow_adrq_bench.errors import BenchError

__all__ = [
    "AIRFLOW_TABLES",
    "BenchError",
    "Target",
    "airflow_url",
    "control_engine",
    "describe",
    "refuse_airflow_database",
    "run",
]

#: Tables whose presence means "this is an Airflow metadata database": never benchmarked.
AIRFLOW_TABLES = ("dag", "dag_run", "task_instance", "asset_dag_run_queue", "serialized_dag", "dag_bundle")

# Airflow 3.3 runs on these sync drivers (SQLAlchemy 2.1 maps a bare
# postgresql:// to psycopg 3, which Airflow 3.3 does not default to).
_AIRFLOW_DRIVERS = {"postgresql": "postgresql+psycopg2", "mysql": "mysql+mysqldb", "mariadb": "mysql+mysqldb"}

# Seconds a worker gets to import Airflow and answer (24 of them share 2 cores).
_START_TIMEOUT = 600


@dataclass(frozen=True)
class Target:
    """A database server to benchmark (``server_url`` is empty for SQLite)."""

    name: str
    backend: str
    server_url: str
    version: str


def airflow_url(url: str | sa.engine.URL) -> str:
    """``url`` with the sync driver Airflow 3.3 uses when none is named (``postgresql+psycopg2`` ...)."""
    parsed = sa.make_url(url)
    driver = _AIRFLOW_DRIVERS.get(parsed.drivername)
    if driver:
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)


def describe(url: str) -> Target:
    """Name, backend and version of the server at ``url`` (connects once; SQLite: the library's version)."""
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        import sqlite3

        return Target("sqlite", "sqlite", "", f"SQLite {sqlite3.sqlite_version}")
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in servers.BACKENDS:
        raise BenchError(f"unsupported database {parsed.drivername!r}: PostgreSQL, MySQL/MariaDB or SQLite")
    version = servers.server_version(url)
    name = "mariadb" if version.startswith("MariaDB") else backend
    return Target(name, backend, airflow_url(url), version)


def refuse_airflow_database(url: str) -> None:
    """Raise :class:`BenchError` if the database ``url`` names already has Airflow tables.

    The benchmark only ever writes a scratch database it creates; a URL
    that points at an Airflow metadata database is refused outright, so that
    nobody mistakes the one for the other.
    """
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if not path or path == ":memory:" or not Path(path).exists():
            return
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()
    found = [name for name in AIRFLOW_TABLES if name in names]
    if found:
        raise BenchError(
            f"refusing {parsed.render_as_string(hide_password=True)}: its database has Airflow tables "
            f"({', '.join(found)}). The benchmark never touches an existing metadata database; give "
            "it a URL of a database without them (it only connects there to create and drop a "
            "scratch database of its own)."
        )


# --- worker processes ------------------------------------------------------


@dataclass
class _Process:
    manager: str
    index: int
    zygote: Any
    conn: Any
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Workers:
    """The worker processes: ``producers`` per manager, each bound to its manager for life.

    One spawned zygote per producer index (its own hash seed) imports Airflow
    and forks that index's worker of every manager (see :mod:`.worker`).
    """

    def __init__(self, managers: Sequence[str], producers: int, home: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.procs: dict[tuple[str, int], _Process] = {}
        self.zygotes: list[Any] = []
        self.closed = False
        # Kept for the processes' lifetime: a barrier collected in this process
        # is gone before a child that has not started yet can attach to it.
        self.barriers = {manager: ctx.Barrier(producers) for manager in managers}
        base = {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/unused.db",
        }
        saved = os.environ.get("PYTHONHASHSEED")
        try:
            for index in range(producers):
                seats = []
                ends = []
                for manager in managers:
                    env = dict(base)
                    class_path = MANAGER_CLASSES[manager]
                    if class_path:
                        env["AIRFLOW__CORE__ASSET_MANAGER_CLASS"] = class_path
                    parent, child = ctx.Pipe()
                    seats.append((manager, child, self.barriers[manager], env))
                    ends.append((manager, parent, child))
                # A hash seed per producer: Airflow iterates a task's outlets as a
                # set, and production processes differ in that order.
                os.environ["PYTHONHASHSEED"] = str(1000 + index)
                zygote = ctx.Process(
                    target=worker_module.zygote, args=(index, base, seats), name=f"adrq-airflow-{index}"
                )
                zygote.start()
                self.zygotes.append(zygote)
                for manager, parent, child in ends:
                    child.close()
                    self.procs[(manager, index)] = _Process(manager, index, zygote, parent)
        finally:
            if saved is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = saved
        try:
            for proc in self.procs.values():
                proc.info = self._receive(proc, _START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def group(self, manager: str) -> list[_Process]:
        return [p for (m, _), p in sorted(self.procs.items()) if m == manager]

    def call(self, proc: _Process, name: str, timeout: float = 600, **kwargs: Any) -> Any:
        proc.conn.send((name, kwargs))
        return self._receive(proc, timeout)

    def broadcast(
        self, procs: Sequence[_Process], name: str, timeout: float = 600, **kwargs: Any
    ) -> list[Any]:
        for proc in procs:
            proc.conn.send((name, kwargs))
        return [self._receive(proc, timeout) for proc in procs]

    def _receive(self, proc: _Process, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not proc.conn.poll(1.0):
            if not proc.zygote.is_alive():
                raise BenchError(f"worker {proc.manager}/{proc.index} is gone; its output is above")
            if time.monotonic() > deadline:
                raise BenchError(f"worker {proc.manager}/{proc.index} did not answer within {timeout:g} s")
        try:
            status, value = proc.conn.recv()
        except EOFError:
            raise BenchError(f"worker {proc.manager}/{proc.index} exited; its output is above") from None
        if status != "ok":
            raise BenchError(f"worker {proc.manager}/{proc.index} failed:\n{value}")
        return value

    def close(self) -> None:
        """Ask every worker to exit; kill (by pid) the workers that do not answer, then the zygotes."""
        if self.closed:
            return
        self.closed = True
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.conn.send(("close", {}))
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            answered = False
            with contextlib.suppress(Exception):
                answered = proc.conn.poll(max(0.1, deadline - time.monotonic()))
            pid = proc.info.get("pid")
            if not answered and pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.conn.close()
        for zygote in self.zygotes:
            zygote.join(timeout=max(0.1, deadline - time.monotonic()))
            if zygote.is_alive():
                zygote.terminate()
                zygote.join(timeout=5)


# --- scratch databases -----------------------------------------------------


@contextlib.contextmanager
def targets(
    urls: Sequence[str],
    backends: Sequence[str] | None,
    *,
    sqlite: bool,
    say: Callable[[str], None],
) -> Iterator[list[Target]]:
    """The databases an Airflow mode measures on, with unique names; servers it started stop at the end.

    ``urls`` (``--db``; each refused if it holds Airflow's tables) or else
    every server :func:`airflow_adrq_bench.servers.discover` finds among
    ``backends`` (all when empty), plus SQLite when ``sqlite``; a backend
    without a server is said and skipped. Raises :class:`BenchError` for
    none at all, or for a SQLite URL when ``sqlite`` is false.
    """
    with contextlib.ExitStack() as stack:
        found: list[Target] = []
        for url in urls:
            if not sqlite and sa.make_url(url).get_backend_name() == "sqlite":
                raise BenchError(
                    "SQLite is not measured here: Airflow does not support the LocalExecutor on it"
                )
            refuse_airflow_database(url)
            found.append(describe(url))
        if not urls:
            if sqlite and (not backends or "sqlite" in backends):
                found.append(describe("sqlite://"))
            for backend in servers.BACKENDS:
                if backends and backend not in backends:
                    continue
                try:
                    info = stack.enter_context(servers.discover(backend))
                except servers.ServerNotFoundError as exc:
                    say(f"not measuring {backend}: {exc}")
                    continue
                say(f"{info.version}: {info.how_found}")
                found.append(describe(info.url))
        if not found:
            raise BenchError("no database to measure on")
        seen: dict[str, int] = {}
        named = []
        for target in found:
            seen[target.name] = seen.get(target.name, 0) + 1
            n = seen[target.name]
            named.append(target if n == 1 else dataclasses.replace(target, name=f"{target.name}{n}"))
        yield named


@contextlib.contextmanager
def _scratch_database(target: Target, workdir: Path) -> Iterator[str]:
    """A new, empty database on the target's server (a file for SQLite); dropped on exit."""
    name = f"adrq_afbench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    if target.backend == "sqlite":
        path = workdir / f"{name}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{path}{suffix}").unlink()
        return
    url = airflow_url(servers.create_database(target.server_url, name))
    try:
        yield url
    finally:
        servers.drop_database(target.server_url, name)


def _airflow_command() -> list[str]:
    script = Path(sys.executable).with_name("airflow")
    return [str(script)] if script.exists() else [sys.executable, "-m", "airflow"]


def _migrate(url: str, home: Path) -> None:
    """``airflow db migrate`` on ``url``: Airflow's own schema, as an operator creates it."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW_")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        }
    )
    result = subprocess.run(
        [*_airflow_command(), "db", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(
            f"airflow db migrate failed (exit {result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )


# --- checks the controller makes (plain SQL, no Airflow) ----------------------


def control_engine(url: str) -> sa.Engine:
    """An engine for the controller's reads: no pool, READ COMMITTED on MySQL (each read sees the latest)."""
    kwargs: dict[str, Any] = {"poolclass": NullPool}
    if sa.make_url(url).get_backend_name() in ("mysql", "mariadb"):
        kwargs["isolation_level"] = "READ COMMITTED"
    return sa.create_engine(url, **kwargs)


def _clear_queue(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM asset_dag_run_queue"))


def _queue_rows(engine: sa.Engine) -> set[tuple[int, str]]:
    with engine.connect() as conn:
        return {
            (int(r[0]), str(r[1]))
            for r in conn.execute(sa.text("SELECT asset_id, target_dag_id FROM asset_dag_run_queue"))
        }


def _events(engine: sa.Engine, prefix: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM asset_event WHERE source_run_id LIKE :p"), {"p": f"{prefix}%"}
            ).scalar_one()
        )


def _analyze(engine: sa.Engine) -> None:
    """Refresh the planner's statistics after seeding, as autovacuum (or an operator) would."""
    if engine.dialect.name == "mysql":
        tables = "dag, asset, asset_active, dag_schedule_asset_reference, asset_event, asset_dag_run_queue"
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ANALYZE TABLE {tables}").fetchall()
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")


def _server_settings(engine: sa.Engine) -> dict[str, str]:
    queries = {
        "postgresql": {"deadlock_timeout": "SHOW deadlock_timeout"},
        "mysql": {
            "innodb_lock_wait_timeout": "SELECT @@innodb_lock_wait_timeout",
            "innodb_deadlock_detect": "SELECT @@innodb_deadlock_detect",
        },
        "sqlite": {},
    }[engine.dialect.name]
    out = {}
    with engine.connect() as conn:
        for key, sql in queries.items():
            with contextlib.suppress(sa.exc.DBAPIError):
                out[key] = str(conn.exec_driver_sql(sql).scalar())
    return out


def _row_check(actual: set[tuple[int, str]], expected: set[tuple[int, str]]) -> dict[str, Any]:
    missing, extra = expected - actual, actual - expected
    return {
        "expected": len(expected),
        "actual": len(actual),
        "missing": [list(r) for r in sorted(missing)[:5]],
        "extra": [list(r) for r in sorted(extra)[:5]],
    }


def _rotate(items: Sequence[str], n: int) -> list[str]:
    if not items:
        return []
    k = n % len(items)
    return [*items[k:], *items[:k]]


# --- the run -----------------------------------------------------------------


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

    def sweep_asset(self, fanout: int) -> str:
        return f"adrq_sweep_f{fanout:05d}"

    def scenario_assets(self, scenario: str) -> list[str]:
        if scenario == "single":
            return ["adrq_single"]
        return [f"adrq_multi_{i}" for i in range(self.sizes.outlets)]

    def assets(self) -> dict[str, int]:
        out = {self.sweep_asset(f): f for f in self.sizes.fanouts}
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
        **rawinfo.opening("airflow-adrq bench --airflow", sizes, managers),
        "manager_classes": {m: MANAGER_CLASSES[m] or "airflow.assets.manager.AssetManager" for m in managers},
        "scenarios": list(scenarios),
        "targets": [],
        "workers": [],
        "sweep": [],
        "rounds": [],
        "skipped": [],
    }
    workdir = Path(tempfile.mkdtemp(prefix="adrq-airflow-bench-"))
    workers: _Workers | None = None
    try:
        progress(
            f"starting {len(managers)} x {sizes.producers} Airflow worker processes "
            "(each imports Airflow: about 3 s of CPU apiece)"
        )
        workers = _Workers(managers, sizes.producers, workdir)
        raw["workers"] = [p.info for p in workers.procs.values()]
        raw["airflow_version"] = next(iter(workers.procs.values())).info["airflow"]
        for target in targets:
            raw["targets"].append(_run_target(target, plan, workers, workdir, raw, progress))
    finally:
        if workers is not None:
            workers.close()
        shutil.rmtree(workdir, ignore_errors=True)
    rawinfo.finish(raw, started)
    return raw


def _run_target(
    target: Target,
    plan: _Plan,
    workers: _Workers,
    workdir: Path,
    raw: dict[str, Any],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    began = last = time.monotonic()
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        phases[name] = round(now - last, 2)
        last = now

    with _scratch_database(target, workdir) as url:
        progress(f"{target.version}: airflow db migrate on a scratch database")
        _migrate(url, workdir)
        lap("migrate_s")
        all_procs = list(workers.procs.values())
        engine = control_engine(url)
        try:
            workers.broadcast(
                all_procs, "target", url=url, pg_deadlock_timeout_ms=plan.pg_deadlock_timeout_ms
            )
            seeder = workers.group(plan.managers[0])[0]
            asset_ids: dict[str, int] = workers.call(
                seeder, "seed", dag_ids=plan.dag_ids, assets=plan.assets()
            )
            _analyze(engine)
            info: dict[str, Any] = {
                "name": target.name,
                "backend": target.backend,
                "version": target.version,
                "settings": _server_settings(engine),
                "phases": phases,
            }
            lap("setup_s")
            measuring = _Measuring(target, plan, workers, engine, asset_ids, raw, progress)
            if plan.sweep:
                _sweep(measuring)
                lap("sweep_s")
            if plan.contention:
                _contention(measuring)
                lap("contention_s")
            workers.broadcast(all_procs, "release")
        except BaseException:
            # Stop the workers before the scratch database is dropped: their
            # open transactions would hold DROP DATABASE up (MySQL metadata locks).
            workers.close()
            raise
        finally:
            engine.dispose()
    lap("teardown_s")
    info["duration_s"] = last - began
    return info


class _Measuring(NamedTuple):
    """One target after its set-up: what the sweep and the contention runs both work with."""

    target: Target
    plan: _Plan
    workers: _Workers
    engine: sa.Engine
    asset_ids: dict[str, int]
    raw: dict[str, Any]
    progress: Callable[[str], None]


def _sweep(measuring: _Measuring) -> None:
    target, plan, workers, engine, asset_ids, raw, progress = measuring
    sizes = plan.sizes
    callers = {m: workers.group(m)[0] for m in plan.managers}
    for fanout in sizes.fanouts:
        asset = plan.sweep_asset(fanout)
        expected = {(asset_ids[asset], d) for d in plan.dag_ids[:fanout]}

        def one(
            manager: str,
            call: int,
            warmup: bool,
            asset: str = asset,
            fanout: int = fanout,
            expected: set[tuple[int, str]] = expected,
        ) -> None:
            _clear_queue(engine)
            result = workers.call(
                callers[manager], "sweep_call", asset=asset, run_id=f"{manager}-sweep-f{fanout}-{call}"
            )
            check = _row_check(_queue_rows(engine), expected)
            raw["sweep"].append(
                {
                    "db": target.name,
                    "fanout": fanout,
                    "manager": manager,
                    "call": call,
                    "warmup": warmup,
                    **result,
                    "rows_exact": check["missing"] == [] and check["extra"] == [],
                    "check": check,
                }
            )

        for manager in plan.managers:
            one(manager, -1, True)
        started = time.monotonic()
        rep = 0
        while rep < sizes.sweep_calls:
            for manager in _rotate(plan.managers, rep):
                one(manager, rep, False)
            rep += 1
            progress(f"{target.version}: sweep F={fanout:,}: {rep} call(s) per manager")
            if rep >= sizes.sweep_min_calls and time.monotonic() - started >= sizes.sweep_budget_s:
                break
    _clear_queue(engine)


def _contention(measuring: _Measuring) -> None:
    target, plan, workers, engine, asset_ids, raw, progress = measuring
    sizes = plan.sizes
    warm_assets = [a for s in plan.scenarios for a in plan.scenario_assets(s)]
    progress(f"{target.version}: contention: warming up every producer (one transaction each)")
    for manager in plan.managers:
        for proc in workers.group(manager):
            workers.call(proc, "warmup", assets=warm_assets, run_id=f"warmup-{manager}-{proc.index}")
    for scenario in plan.scenarios:
        assets = plan.scenario_assets(scenario)
        expected = {(asset_ids[a], d) for a in assets for d in plan.dag_ids[: sizes.fanout]}
        stopped: set[str] = set()
        for round_no in range(sizes.rounds):
            for manager in _rotate(plan.managers, round_no):
                if manager in stopped:
                    continue
                progress(
                    f"{target.version}: contention {scenario}, round {round_no + 1}/{sizes.rounds}: {manager}"
                )
                _clear_queue(engine)
                prefix = f"{manager}-{scenario}-r{round_no}-"
                results = workers.broadcast(
                    workers.group(manager),
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
                check = _row_check(_queue_rows(engine), expected if committed else set())
                events = _events(engine, prefix)
                exact = not check["missing"] and not check["extra"] and events == committed * len(assets)
                raw["rounds"].append(
                    {
                        "db": target.name,
                        "scenario": scenario,
                        "manager": manager,
                        "round": round_no,
                        "duration_s": max(r["end"] for r in results) - min(r["start"] for r in results),
                        "committed": committed,
                        "abandoned": len(txs) - committed,
                        "events": events,
                        "expected_events": committed * len(assets),
                        "rows_exact": exact,
                        "check": check,
                        "transactions": txs,
                    }
                )
                if committed < len(txs):
                    stopped.add(manager)
                    if round_no + 1 < sizes.rounds:
                        raw["skipped"].append(
                            {
                                "db": target.name,
                                "scenario": scenario,
                                "manager": manager,
                                "reason": f"round {round_no + 1} ran out of its {sizes.round_budget_s:g} s "
                                "budget; later rounds skipped",
                            }
                        )
    _clear_queue(engine)
