"""``airflow-adrq bench --airflow --accounting``: asset events that no run consumes, through Airflow itself.

    airflow-adrq bench --airflow --accounting                # SQLite + every PostgreSQL/MariaDB server found
    airflow-adrq bench --airflow --accounting --db postgresql://root@127.0.0.1/postgres

The library benchmark's lost_events scenario applies a copy of Airflow 3.3.2's scheduler rule; this mode
measures the same with Airflow's own code on both sides. Producers: the Airflow mode's worker processes, each
bound to one asset manager through [core] asset_manager_class (stock: Airflow's AssetManager; plugin:
airflow_adrq.airflow.AdrqAssetManager), run task-success transactions through
TaskInstance.register_asset_changes_in_db with one outlet, hold them open (the rest of task success) and
COMMIT. Consumer: one more Airflow process running the scheduler's own
SchedulerJobRunner._create_dagruns_for_dags pass after pass while the producers run (runs are created QUEUED,
nothing executes), on real serialized DAGs scheduled on the cell's asset.

Per database, hold and manager (a cell, with an asset and consumer DAGs of its own; with --fan-in also cells
where each producer emits an asset of its own and one DAG is scheduled on any of them: the race between
producers of different assets through DagModel.dags_needing_dagruns): the consumer passes while every producer
commits its transactions; then it drains (passes until no queue row of the cell is left); then one producer
commits a sentinel event and the consumer drains again. An event whose queue row already existed waits for the
next run of its DAG: it is late, not lost, and the sentinel's runs pick it up. Each (event, consumer DAG) pair
is then consumed (by a run before the sentinel), late (only by the sentinel's runs) or unconsumed (in no run's
consumed_asset_events). Checks (exit status 1 when one fails): the events are exactly the committed
transactions; every event is in one class; no run consumed another asset's event; every consumer DAG consumed
the sentinel; no queue row is left; the plug-in leaves no more events unconsumed than stock in the same cell,
and consumes no pair twice; no producer transaction of the plug-in failed, with any error (every failed
attempt counts, though the bench replays retryable ones); in fan-in cells of one consumer DAG, the plug-in's
event COMMIT->run p99 is at most 500 ms (not judged on SQLite: one writer at a time) (the verdict). The
controller never imports Airflow.

``--schedulers N`` runs N consumer processes (each its own scheduler Job, as Airflow's HA schedulers; one
where Airflow supports no HA scheduler: SQLite, MariaDB);
``--fan-in-consumers N`` gives fan-in cells N consumer DAGs on any producer's asset; ``--dag-writers``
runs Airflow's other writers of the cell's ``dag`` rows beside them (:mod:`.writers`: the DAG processor's
sync back to back, a ``PATCH /dags/{id}`` pause loop on 2 extra consumer DAGs left out of the accounting,
the bulk ``PATCH /dags`` statement). Event->run: for every pair consumed before the sentinel, from its
producer's COMMIT (wall clock as COMMIT returned) to the end of the scheduler pass that created the run
(the run's ``creating_job_id`` and ``queued_at`` place it in that scheduler's pass; its COMMIT ends it)."""

from __future__ import annotations

import bisect
import contextlib
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from airflow_adrq_bench import exits, options, progress, stats, tables
from airflow_adrq_bench.airflow_mode import databases, parser_for, worker
from airflow_adrq_bench.airflow_mode.accounting import consumer, writers
from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_DEFAULT as DEFAULT
from airflow_adrq_bench.airflow_mode.config import ACCOUNTING_QUICK as QUICK
from airflow_adrq_bench.airflow_mode.config import STOCK_AND_PLUGIN as MANAGERS
from airflow_adrq_bench.airflow_mode.config import AccountingSizes
from airflow_adrq_bench.airflow_mode.databases import fetch
from airflow_adrq_bench.airflow_mode.processes import close_all
from airflow_adrq_bench.airflow_mode.report import conclude, heading, raw_opening
from airflow_adrq_bench.airflow_mode.run import Controller
from airflow_adrq_bench.errors import BenchError
from airflow_adrq_bench.verdict import Line, line
from airflow_adrq_bench.verdict import Target as Goal


def main(argv: Sequence[str] | None = None) -> int:
    """Run the accounting mode; returns the exit status (1: a check failed or the plug-in lost more)."""
    parser = parser_for(__doc__ or "", "--accounting", ("--quick", "smaller cells"))
    options.add_fields(parser.add_argument_group("sizes"), DEFAULT, QUICK)
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    sizes = options.sizes_from(parser, args, QUICK if args.preset else DEFAULT)

    def measure() -> int:
        out = options.out_dir(args)
        with databases.targets(args.db or [], args.backend, sqlite=True) as found:
            raw = run(found, sizes)
        lines = verdict(raw["cells"])
        # Every target here is one of correctness: a miss fails the run, --check or not.
        judged = exits.judge(raw["problems"], lines, check=True)
        return conclude(out / "airflow-accounting", raw, format_tables(raw), lines, judged)

    return options.guarded(parser, args, measure, airflow="apache-airflow-core 3.3")


_COLUMNS: tables.Columns = {
    "database": "db",
    "hold": lambda c: f"{c['hold_ms']:g} ms",
    "shape": "shape",
    "sched": lambda c: str(c.get("schedulers", 1)),
    "manager": "manager",
    "events": "events",
    "consumed": "consumed",
    "late": "late",
    "unconsumed": lambda c: f"**{c['unconsumed']}**",
    "in no run": "in_no_run",
    "pairs c/l/u": lambda c: f"{c['consumed_pairs']}/{c['late_pairs']}/{c['unconsumed_pairs']}",
    "dup": "duplicate_pairs",
    "runs (sentinel)": lambda c: f"{c['runs']} ({c['runs'] - c['runs_before_sentinel']})",
    "errors p/c": lambda c: f"{sum(c['producer_failures'].values())}/{sum(c['consumer_db_errors'].values())}",
    "producers failed by error": lambda c: _kinds(c["producer_failures"]),
    "commit ms p50/p99/max": lambda c: _ms(c, "tx"),
    "event->run ms p50/p99/max": lambda c: _ms(c, "run"),
    "round s": lambda c: f"{c['duration_s']:.1f}",
}


def _writer(kind: str, cell: Mapping[str, Any]) -> str:
    w = next(w for w in cell["writers"] if w["kind"] == kind)
    done = f"{w['writes']} ({w['p50_ms']:.0f}/{w['max_ms']:.0f})"
    return f"{done}; {_kinds(w['errors'])}; {_kinds(w['db_errors'])}"


def _kinds(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "0"


def _ms(cell: Mapping[str, Any], prefix: str) -> str:
    return "/".join(tables.fmt(cell.get(f"{prefix}_{q}_ms", float("nan")), 0) for q in ("p50", "p99", "max"))


_WRITER_COLUMNS: tables.Columns = {
    "database": "db",
    "hold": lambda c: f"{c['hold_ms']:g} ms",
    "shape": "shape",
    "manager": "manager",
    **{f"{kind}: writes (p50/max ms); failed; db errors": partial(_writer, kind) for kind in writers.KINDS},
}


def format_tables(raw: dict[str, Any]) -> str:
    """The accounting table (Markdown) with its legend and each cell's problems."""
    sizes = raw["sizes"]
    versions = ", ".join(f"{t['name']}: {t['version']}" for t in raw["targets"])
    lines = [
        heading("Event accounting, stock AssetManager vs airflow-adrq's plug-in", raw),
        "",
        f"{sizes['producers']} producers per manager x {sizes['transactions']} transactions, "
        f"{sizes['consumers']} consumer DAGs (fan-in: {sizes.get('fan_in_consumers', 1)}), "
        f"{sizes.get('schedulers', 1)} scheduler(s) passing every {sizes['consumer_pause_ms']:g} ms"
        f"{', Airflow writers of the dag rows beside them' if sizes.get('dag_writers') else ''}; "
        f"databases: {versions}.",
        "",
        tables.table(raw["cells"], _COLUMNS, left=4),
        "",
        tables.legend("accounting"),
    ]
    if any(c.get("writers") for c in raw["cells"]):
        lines += [
            "",
            tables.table(raw["cells"], _WRITER_COLUMNS, left=4),
            "",
            tables.legend("accounting_writers"),
        ]
    if raw["problems"]:
        lines += ["", "Problems:", *[f"* {p}" for p in raw["problems"]]]
    return "\n".join(lines)


# --- the controller (it imports no Airflow): per cell the producers and the consumer; what its events became.

WARM_ASSET = "adrq_acct_warm"
#: From worst to best: an event is in the worst class of its pairs.
_CLASSES = ("unconsumed", "late", "consumed")


class PairClasses(NamedTuple):
    """Every (event, consumer DAG) pair and every event of a cell, each in exactly one class."""

    pairs: int
    consumed_pairs: int
    late_pairs: int
    unconsumed_pairs: int
    duplicate_pairs: int  # consumed by more than one run of the DAG (counted once above)
    events: int
    consumed: int  # every pair consumed before the sentinel
    late: int  # no pair unconsumed, at least one only by the sentinel's runs
    unconsumed: int  # at least one consumer DAG's runs never consumed it
    in_no_run: int  # consumed by no run of any consumer DAG
    unknown: int  # consumed pairs of the cell's DAGs whose event is neither the cell's nor the sentinel
    sentinel_consumers: int  # consumer DAGs that consumed the sentinel

    @property
    def classes_add_up(self) -> bool:
        return (
            self.consumed_pairs + self.late_pairs + self.unconsumed_pairs == self.pairs
            and self.consumed + self.late + self.unconsumed == self.events
        )


def classify(
    events: Iterable[int],
    dags: Sequence[str],
    consumed: Iterable[tuple[int, str, int]],
    cutoff: int,
    sentinel: int | None,
) -> PairClasses:
    """Classify ``events`` x ``dags`` from ``consumed`` rows ``(dag_run id, dag_id, event id)``: a pair is
    *consumed* if a run created before the sentinel (``id <= cutoff``) consumed it, *late* if only later
    runs did, *unconsumed* if none did."""
    event_ids = sorted(set(events))
    known, cell_dags = set(event_ids), set(dags)
    runs_of: dict[tuple[int, str], set[int]] = defaultdict(set)
    sentinel_dags: set[str] = set()
    unknown = 0
    for run_id, dag_id, event_id in ((int(r), str(d), int(e)) for r, d, e in consumed):
        if dag_id not in cell_dags:
            continue
        if event_id in known:
            runs_of[(event_id, dag_id)].add(run_id)
        elif sentinel is not None and event_id == sentinel:
            sentinel_dags.add(dag_id)
        else:
            unknown += 1

    def pair_class(event: int, dag: str) -> str:
        runs = runs_of.get((event, dag))
        return "unconsumed" if not runs else "consumed" if min(runs) <= cutoff else "late"

    per_event = {e: {pair_class(e, d) for d in dags} for e in event_ids}
    pairs = Counter(pair_class(e, d) for e in event_ids for d in dags)
    worst = Counter(next(c for c in _CLASSES if c in classes) for classes in per_event.values())
    return PairClasses(
        pairs=len(event_ids) * len(dags),
        consumed_pairs=pairs["consumed"],
        late_pairs=pairs["late"],
        unconsumed_pairs=pairs["unconsumed"],
        duplicate_pairs=sum(1 for runs in runs_of.values() if len(runs) > 1),
        events=len(event_ids),
        consumed=worst["consumed"],
        late=worst["late"],
        unconsumed=worst["unconsumed"],
        in_no_run=sum(1 for classes in per_event.values() if classes == {"unconsumed"}),
        unknown=unknown,
        sentinel_consumers=len(sentinel_dags),
    )


def event_to_run_ms(
    commits: Mapping[int, float],
    consumed: Iterable[tuple[int, str, int]],
    cutoff: int,
    runs: Mapping[int, tuple[int | None, float | None]],
    passes: Mapping[int, Sequence[tuple[float, float]]],
) -> tuple[list[float], int]:
    """Per (event, DAG) pair of ``commits`` (event id -> wall clock of its COMMIT) consumed by a run created
    before the sentinel (``id <= cutoff``), the milliseconds from the COMMIT to the end of the pass that
    created its first such run: ``runs[id] = (creating job, queued_at)``, ``passes[job]`` the job's
    ``(start, end)`` in order; the pass is the last one started by ``queued_at``. Sorted; and how many runs
    no pass holds (measured to ``queued_at`` instead: a lower bound)."""
    first: dict[tuple[int, str], int] = {}
    for run_id, dag_id, event_id in consumed:
        if event_id in commits and run_id <= cutoff:
            key = (event_id, dag_id)
            first[key] = min(first.get(key, run_id), run_id)
    starts = {job: [s for s, _ in intervals] for job, intervals in passes.items()}
    latencies, unplaced = [], 0
    for (event_id, _), run_id in first.items():
        job, queued_at = runs.get(run_id, (None, None))
        if queued_at is None:
            unplaced += 1
            continue
        visible = queued_at
        own = passes.get(job, ()) if job is not None else ()
        index = bisect.bisect_right(starts.get(job, []), queued_at) - 1 if job is not None else -1
        if index >= 0 and own[index][1] >= queued_at:
            visible = own[index][1]
        else:
            unplaced += 1
        latencies.append((visible - commits[event_id]) * 1000)
    return sorted(latencies), unplaced


class _Cell(NamedTuple):
    """One cell: a hold, a shape (``fan_out`` or ``fan_in``), a manager, and its consumer DAGs."""

    hold_ms: float
    shape: str
    manager: str
    name: str
    schedules: dict[str, list[str]]  # consumer DAG -> the assets it is scheduled on (any of them)
    extra: dict[str, list[str]]  # --dag-writers: the DAGs paused and unpaused, left out of the accounting


def run(targets: Sequence[databases.Target], sizes: AccountingSizes) -> dict[str, Any]:
    """Stock and the plug-in in every cell on every target; the raw results (``cells``, ``problems`` ...)."""
    return _Accounting(sizes).run(targets)


@dataclass
class _Accounting(Controller):
    """The cells, on the producers and the consumer; then, per target, its set-up and every cell."""

    sizes: AccountingSizes
    managers = MANAGERS
    starting = "starting the consumer and the producers"

    def __post_init__(self) -> None:
        sizes = self.sizes
        opening = raw_opening("airflow-adrq bench --airflow --accounting", sizes, MANAGERS)
        self.raw = opening | {records: [] for records in ("targets", "cells", "problems")}
        self.cells: list[_Cell] = []
        for h, hold_ms in enumerate(sizes.holds_ms):  # the managers take turns at going first
            for shape in ("fan_out", "fan_in") if sizes.fan_in else ("fan_out",):
                for manager in databases.rotate(MANAGERS, h):
                    name = f"adrq_acct_h{h}_{shape}_{manager}"
                    if shape == "fan_out":
                        assets, count = [name], sizes.consumers
                    else:
                        assets, count = (
                            [f"{name}_p{i}" for i in range(sizes.producers)],
                            sizes.fan_in_consumers,
                        )
                    schedules = {f"{name}_c{k}": assets for k in range(count)}
                    extra = {f"{name}_x{k}": assets for k in range(2 if sizes.dag_writers else 0)}
                    self.cells.append(_Cell(hold_ms, shape, manager, name, schedules, extra))
        self.steps = len(self.cells) + 1  # and the warm-up

    def start(self, stack: contextlib.ExitStack, home: Path, bar: progress.Task) -> None:
        self.consumers = [consumer.Consumer(home, f"scheduler {n}") for n in range(self.sizes.schedulers)]
        kinds = writers.KINDS if self.sizes.dag_writers else ()
        self.writers = {kind: consumer.Consumer(home, f"writer {kind}") for kind in kinds}
        self.consumer = self.consumers[0]
        stack.callback(close_all, [*self.consumers, *self.writers.values()])
        super().start(stack, home, bar)
        self.raw["consumer"] = {"pid": self.consumer.started()}
        self.raw["schedulers"] = [c.started() for c in self.consumers]
        self.raw["writers"] = {kind: w.started() for kind, w in self.writers.items()}

    def measure(self, url: str) -> dict[str, Any]:
        dialects = [c.call(consumer.target, url) for c in [*self.consumers, *self.writers.values()]]
        dialect = dialects[0]
        schedules = {f"{WARM_ASSET}_c{k}": [WARM_ASSET] for k in range(self.sizes.consumers)}
        schedules |= {d: a for cell in self.cells for d, a in (cell.schedules | cell.extra).items()}
        self.asset_ids: dict[str, int] = self.consumer.call(consumer.seed, schedules, worker.PRODUCER_DAG)
        databases.analyze(self.engine)
        self.bar.step("warming up every producer (one transaction each)", 1)
        for (manager, index), proc in self.workers.procs.items():
            if not proc.call(worker.warmup, assets=[WARM_ASSET], run_id=f"warmup-{manager}-{index}"):
                raise BenchError(f"{self.target.version}: warm-up of {manager}/{index} failed")
        databases.clear_queue(self.engine)
        for cell in self.cells:
            where = f"hold {cell.hold_ms:g} ms {cell.shape} {cell.manager}"
            self.bar.step(where, 1)
            found = {"db": self.target.name, "version": self.target.version} | self.cell(cell)
            self.raw["cells"].append(found)
            self.raw["problems"] += [f"{self.target.name} {where}: {p}" for p in found["problems"]]
        for proc in [*self.consumers, *self.writers.values()]:
            proc.call(consumer.release)
        return {"dialect": dialect}

    def cell(self, cell: _Cell) -> dict[str, Any]:
        """One cell: the producers' round while the consumer passes, the sentinel, the drain; the counts."""
        sizes, dags, producers = self.sizes, list(cell.schedules), self.workers.group(cell.manager)
        assets = sorted({a for names in cell.schedules.values() for a in names})
        prefix, sentinel_run = f"acct-{cell.name}-", f"sentinel-{cell.name}"
        kw = dict(assets=[cell.name], run_prefix=prefix, transactions=sizes.transactions)
        kw |= dict(hold_s=cell.hold_ms / 1000, budget_s=sizes.budget_s, own_asset=cell.shape == "fan_in")
        work = partial(self.workers.broadcast, producers, worker.round_of, sizes.budget_s + 600, **kw)
        # Airflow supports several schedulers only where its row locks are taken (with_row_locks): not on
        # SQLite, MariaDB or MySQL before 8 (their schedulers would create runs of the same DAG twice).
        dialect = self.engine.dialect
        ha = dialect.name == "postgresql" or getattr(dialect, "supports_for_update_of", False)
        schedulers = self.consumers if ha else self.consumers[:1]
        loops: list[consumer.Loop] = [
            (c, consumer.consume, (dags, sizes.consumer_pause_ms / 1000)) for c in schedulers
        ]
        every = cell.schedules | cell.extra
        loops += [
            (w, writers.loop, (kind, every, list(cell.extra), cell.name)) for kind, w in self.writers.items()
        ]
        start = time.monotonic()
        results, looped = consumer.during(loops, partial(work, keep_going=True))
        duration = time.monotonic() - start
        passes = _merged(looped[: len(schedulers)])
        with self.engine.connect() as conn:
            cutoff = int(fetch(conn, "SELECT coalesce(max(id), 0) FROM dag_run")[0][0])
        sentinel = producers[0].call(worker.warmup, assets=assets[:1], run_id=sentinel_run)
        drained = self.consumer.call(consumer.drain, dags)

        txs = [tx for r in results for tx in r["transactions"]]
        committed = sum(1 for tx in txs if tx["ok"])
        not_started = sum(1 for tx in txs if not tx["ok"] and tx["attempts"] == 0)
        run_rows = self.consumer.call(consumer.runs, dags)
        with self.engine.connect() as conn:
            ids = [self.asset_ids[a] for a in assets]
            rows = fetch(conn, "SELECT id, source_run_id FROM asset_event WHERE asset_id IN :ids", ids=ids)
            consumed = fetch(
                conn,
                "SELECT r.id, r.dag_id, e.event_id FROM dag_run r "
                "JOIN dagrun_asset_event e ON e.dag_run_id = r.id WHERE r.dag_id IN :dags",
                dags=dags,
            )
            runs = fetch(conn, "SELECT id, run_type FROM dag_run WHERE dag_id IN :dags", dags=dags)
            deadlock = databases.latest_deadlock(conn)
        events = [e for e, run_id in rows if run_id.startswith(prefix)]
        sentinels = [e for e, run_id in rows if run_id == sentinel_run]
        strays = len(rows) - len(events) - len(sentinels)
        sentinel_id = sentinels[0] if len(sentinels) == 1 else None
        found = classify(events, dags, consumed, cutoff, sentinel_id)
        committed_at = {tx["run_id"]: tx["committed_at"] for tx in txs if tx["ok"]}
        commits = {e: committed_at[run_id] for e, run_id in rows if run_id in committed_at}
        jobs = {p["job_id"]: p["intervals"] for p in looped[: len(schedulers)]}
        run_ms, unplaced = event_to_run_ms(
            commits, consumed, cutoff, {r: (job, at) for r, job, at in run_rows}, jobs
        )
        tx_ms = [tx["latency_s"] * 1000 for tx in txs if tx["ok"]]
        left = passes["drain"]["queue_rows_left"] + drained["queue_rows_left"]
        bad_types = [t for _, t in runs if t != "asset_triggered"]
        problems = []
        if len(events) != committed:
            problems.append(f"{len(events)} events in the database, {committed} committed transactions")
        if strays:
            problems.append(f"{strays} events of the cell's assets from neither the round nor the sentinel")
        if not found.classes_add_up or found.pairs != committed * len(dags):
            problems.append(
                f"classes do not add up: {found.consumed} + {found.late} + {found.unconsumed} events "
                f"of {found.events}; {found.pairs} pairs for {committed} committed x {len(dags)} DAGs"
            )
        if found.unknown:
            problems.append(f"runs of the cell's DAGs consumed {found.unknown} pairs of unknown events")
        if not sentinel or sentinel_id is None:
            problems.append(f"the sentinel was not committed exactly once ({len(sentinels)} events)")
        elif found.sentinel_consumers != len(dags):
            problems.append(f"{found.sentinel_consumers} of {len(dags)} consumer DAGs consumed the sentinel")
        if left:
            problems.append(f"{left} queue rows left after the drains")
        if bad_types:
            problems.append(f"{len(bad_types)} runs not asset-triggered: {sorted(set(bad_types))}")
        failures = [passes["failures"], passes["drain"]["failures"], drained["failures"]]
        if unplaced:
            problems.append(f"{unplaced} runs placed in no scheduler pass (event->run to queued_at instead)")
        return {
            "manager": cell.manager,
            "hold_ms": cell.hold_ms,
            "shape": cell.shape,
            "producers": len(producers),
            "planned": len(txs),
            "committed": committed,
            "gave_up": len(txs) - committed - not_started,
            "not_started": not_started,
            "producer_failures": dict(sum((Counter(tx["failures"]) for tx in txs), Counter())),
            **{f"tx_{k}": v for k, v in stats.latency(tx_ms).items() if k in ("p50_ms", "p99_ms", "max_ms")},
            **{
                f"run_{k}": v for k, v in stats.latency(run_ms).items() if k in ("p50_ms", "p99_ms", "max_ms")
            },
            "run_pairs": len(run_ms),
            "runs_unplaced": unplaced,
            "schedulers": len(schedulers),
            "writers": [w for w in looped[len(schedulers) :]],
            "consumers": len(dags),
            **found._asdict(),
            "runs": len(runs),
            "runs_before_sentinel": sum(1 for r, _ in runs if r <= cutoff),
            "duration_s": duration,
            "consumer_passes": passes["passes"],
            "pass_p50_ms": passes["pass_p50_ms"],
            "pass_max_ms": passes["pass_max_ms"],
            "consumer_failures": dict(sum(map(Counter, failures), Counter())),
            "consumer_db_errors": passes["db_errors"],
            "drain_passes": passes["drain"]["passes"] + drained["passes"],
            "latest_deadlock": deadlock or None,
            "queue_rows_left": left,
            "problems": problems,
        }


def _merged(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The schedulers' :func:`.consumer.consume` results as one: counts added, the slowest pass."""

    def added(key: str, of: Iterable[dict[str, Any]]) -> dict[str, int]:
        return dict(sum((Counter(p[key]) for p in of), Counter()))

    drains = [p["drain"] for p in passes]
    return {
        "passes": sum(p["passes"] for p in passes),
        "pass_p50_ms": max(p["pass_p50_ms"] for p in passes),
        "pass_max_ms": max(p["pass_max_ms"] for p in passes),
        "failures": added("failures", passes),
        "db_errors": added("db_errors", passes),
        "drain": {
            "passes": sum(d["passes"] for d in drains),
            "failures": added("failures", drains),
            "queue_rows_left": min(d["queue_rows_left"] for d in drains),
        },
    }


#: The plug-in leaves no more events unconsumed than stock at the same hold (the value: how many more).
UNCONSUMED = Goal("events unconsumed, vs stock", "<= stock", lambda more: more <= 0)
TWICE = Goal("pairs consumed twice", "0", lambda pairs: pairs == 0)
FAILED = Goal("producer transactions failed (any error)", "0", lambda failed: failed == 0)
#: In fan-in cells of one consumer DAG: no consumer starved by its producers.
EVENT_TO_RUN = Goal("event COMMIT->run p99, fan-in to one DAG", "<= 500 ms", lambda ms: ms <= 500)


def verdict(cells: Sequence[dict[str, Any]]) -> list[Line]:
    """Per database, hold and shape: the plug-in's unconsumed events against stock's, its pairs consumed
    twice, its producer transactions failed; in fan-in cells of one DAG its event COMMIT->run p99."""
    by_key: dict[tuple[str, float, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for cell in cells:
        by_key[(cell["db"], cell["hold_ms"], cell.get("shape", "fan_out"))][cell["manager"]] = cell
    lines = []
    for (db, hold, shape), managers in by_key.items():
        where = f", {hold:g} ms" + (", fan-in" if shape == "fan_in" else "")
        if (plugin := managers.get("plugin")) is None:
            continue
        if "stock" in managers:
            mine, theirs = plugin["unconsumed"], managers["stock"]["unconsumed"]
            lines.append(line(db, UNCONSUMED, mine - theirs, f"{mine} vs {theirs}", UNCONSUMED.what + where))
        twice = plugin["duplicate_pairs"]
        lines.append(line(db, TWICE, twice, f"{twice}", TWICE.what + where))
        if "producer_failures" in plugin:
            failed = plugin["producer_failures"]
            lines.append(line(db, FAILED, sum(failed.values()), _kinds(failed), FAILED.what + where))
        if shape == "fan_in" and plugin.get("consumers") == 1 and "run_p99_ms" in plugin and db != "sqlite":
            p99, stock = plugin["run_p99_ms"], managers.get("stock", {}).get("run_p99_ms", float("nan"))
            shown = f"{p99:.0f} ms (stock {stock:.0f} ms)"
            lines.append(line(db, EVENT_TO_RUN, p99, shown, f"event COMMIT->run p99, {hold:g} ms, fan-in"))
    return lines
