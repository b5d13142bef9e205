"""Differential test: the rows ``register_asset_change`` writes, against a pure-Python oracle.

Each seed generates a random reference graph (assets, DAGs, aliases; direct,
name, URI and alias schedule references; paused and partitioned DAGs; one
DAG reached through several routes; inactive assets sharing a name or a URI
with an active one; references by name/URI that match no asset or differ
only in case) and a sequence of transactions registering asset events
(unknown assets, duplicate assets in one transaction, events with a
``partition_key``, new alias names, rolled-back transactions, single calls
and ``register_asset_changes`` batches). The oracle applies Airflow 3.3.2's
rules (``AssetManager.register_asset_change``) to the graph:

* an unknown ``(name, uri)`` logs a warning, returns ``None`` and writes nothing;
* every event of a known asset is written (with its alias links and
  ``asset_alias_asset_event`` rows, missing aliases created);
* an event without ``partition_key`` queues ``(asset_id, dag_id)`` for every
  DAG that is unpaused and not partitioned and is scheduled on the asset
  directly, by its name, by its URI, or on an alias the event went through;
  an event with a ``partition_key`` queues nothing in ``asset_dag_run_queue``;
* a row already queued stays, and its ``created_at`` becomes the newest
  timestamp of the events that stand for it (``on_conflict="auto"``, the
  default, refreshes; on MariaDB it keeps the old one, as Airflow does); a
  row no event of the transaction stands for is left as it is; a
  rolled-back transaction leaves nothing.

After every transaction the whole queue is compared with the oracle, on
every backend and in both queue modes; at the end the event, alias, alias
link and alias-event rows too. The commit-time stamp (the events'
``timestamp`` and their new queue rows' ``created_at`` set to one value just
before COMMIT) is checked by its own test, on the same scenarios.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_adrq import AssetChange, dialects, register_asset_change, register_asset_changes
from airflow_adrq.models import AssetEvent
from tests.factories import (
    add_graph,
    alias_event_links,
    alias_links,
    asset_ref,
    queue_rows,
    stored_aliases,
    task_instance,
)

SEEDS = [11, 23, 37, 41, 59]
NOT_FOUND = "not found; cannot create asset event"


# --- the random graph and transactions ----------------------------------------


@dataclass
class Graph:
    dags: list[str]
    paused: set[str]
    partitioned: set[str]
    assets: list[tuple[str, str]]  # (name, uri), in insertion order
    inactive: set[tuple[str, str]]
    aliases: list[str]
    direct: set[tuple[tuple[str, str], str]]  # ((name, uri), dag_id)
    by_name: set[tuple[str, str]]  # (name, dag_id)
    by_uri: set[tuple[str, str]]  # (uri, dag_id)
    by_alias: set[tuple[str, str]]  # (alias name, dag_id)
    links: set[tuple[str, tuple[str, str]]]  # (alias name, (name, uri)) existing before the test

    def consumers(self, key: tuple[str, str], alias_names) -> set[str]:
        """Airflow 3.3.2: DAGs an event of ``key`` through ``alias_names`` queues (partition_key None)."""
        name, uri = key
        dags = {d for k, d in self.direct if k == key}
        dags |= {d for n, d in self.by_name if n == name}
        dags |= {d for u, d in self.by_uri if u == uri}
        dags |= {d for a, d in self.by_alias if a in set(alias_names)}
        return {d for d in dags if d not in self.paused and d not in self.partitioned}


@dataclass
class Change:
    key: tuple[str, str]
    extra: dict | None
    alias_names: tuple[str, ...]
    partition_key: str | None
    known: bool


@dataclass
class Transaction:
    changes: list[Change]
    api: str  # "single": one register_asset_change per change; "batch": register_asset_changes
    ti: object | None
    rollback: bool


def _sample(rng, population, k_max):
    population = sorted(population)
    return rng.sample(population, rng.randint(0, min(k_max, len(population))))


def make_graph(rng: random.Random) -> Graph:
    dags = [f"dag_{i:02d}" for i in range(rng.randint(14, 20))]
    paused = set(rng.sample(dags, len(dags) // 5))
    # (A DAG may be both.)
    partitioned = set(rng.sample(dags, len(dags) // 6))
    n = rng.randint(12, 18)
    active = [(f"asset_{i}", f"s3://bucket/{i}.csv") for i in range(n)]
    # Inactive assets: one shares an active asset's name, one its URI (name and
    # URI are unique among active assets only), one is unrelated.
    twin_name = (active[0][0], "s3://elsewhere/twin-of-0")
    twin_uri = ("twin_of_1", active[1][1])
    lonely = ("lonely", "file:///lonely")
    inactive = {twin_name, twin_uri, lonely}
    assets = [*active, twin_name, twin_uri, lonely]
    aliases = [f"alias_{k}" for k in range(rng.randint(3, 6))]

    direct = {(key, d) for key in assets for d in _sample(rng, dags, 4)}
    names = [a[0] for a in assets] + ["no_such_asset", active[2][0].upper()]
    uris = [a[1] for a in assets] + ["s3://nowhere/x", active[3][1].upper()]
    by_name = {(nm, d) for nm in names if rng.random() < 0.5 for d in _sample(rng, dags, 3)}
    by_uri = {(u, d) for u in uris if rng.random() < 0.5 for d in _sample(rng, dags, 3)}
    by_alias = {(a, d) for a in aliases for d in _sample(rng, dags, 4)}
    # References that differ from an asset's name / URI only in case match
    # nothing (every backend compares them case-sensitively, as Airflow's
    # collations do): the only routes to "case_only" and "dangling_only".
    dags += ["case_only", "dangling_only"]
    by_name |= {(active[2][0].upper(), "case_only"), ("no_such_asset", "dangling_only")}
    by_uri |= {(active[3][1].upper(), "case_only"), ("s3://nowhere/x", "dangling_only")}
    # One unpaused DAG reached by every route at once, and a paused and a
    # partitioned one too.
    everywhere = sorted(set(dags) - paused - partitioned - {"case_only", "dangling_only"})[0]
    for d in (everywhere, sorted(paused)[0], sorted(partitioned)[-1]):
        for key in rng.sample(active, 3):
            direct.add((key, d))
            by_name.add((key[0], d))
            by_uri.add((key[1], d))
        for a in aliases[:2]:
            by_alias.add((a, d))
    links = {(rng.choice(aliases), rng.choice(assets)) for _ in range(4)}
    return Graph(
        dags, paused, partitioned, assets, inactive, aliases, direct, by_name, by_uri, by_alias, links
    )


def make_transactions(rng: random.Random, graph: Graph) -> list[Transaction]:
    transactions = []
    for t in range(rng.randint(6, 8)):
        # The first transaction (never rolled back) emits the assets that have
        # inactive twins or case-variant references.
        changes: list[Change] = (
            [Change(key, None, (), None, True) for key in (*graph.assets[:4], *graph.assets[-3:])]
            if t == 0
            else []
        )
        for j in range(rng.randint(1, 8)):
            roll = rng.random()
            if changes and roll < 0.2:
                # The same asset again in this transaction (other extra/aliases).
                earlier = changes[rng.randrange(len(changes))]
                key, known = earlier.key, earlier.known
            elif roll < 0.3:
                # Unknown: a known name with another URI, or nothing at all.
                key = rng.choice(
                    [(graph.assets[0][0], f"s3://unknown/{t}-{j}"), (f"ghost_{t}_{j}", "s3://g")]
                )
                known = False
            else:
                key, known = rng.choice(graph.assets), True
            aliases: list[str] = []
            if rng.random() < 0.5:
                aliases = rng.sample(graph.aliases, rng.randint(1, 2))
            if rng.random() < 0.15:
                aliases.append(f"new_alias_{t}_{j}")
            changes.append(
                Change(
                    key=key,
                    extra=rng.choice([None, {"t": t, "j": j}, {"nested": {"k": [1, 2]}}]),
                    alias_names=tuple(aliases),
                    partition_key=f"2024-01-0{j + 1}" if rng.random() < 0.15 else None,
                    known=known,
                )
            )
        transactions.append(
            Transaction(
                changes=changes,
                api=rng.choice(["single", "batch"]),
                ti=task_instance(
                    dag_id=f"producer_{t}", task_id=f"task_{t}", run_id=f"run_{t}", map_index=t - 1
                )
                if rng.random() < 0.7
                else None,
                rollback=t == 1 or (t > 1 and rng.random() < 0.1),
            )
        )
    return transactions


def setup_graph(engine, graph: Graph) -> tuple[dict, dict]:
    """Insert the graph (set-based); returns ((name, uri) -> asset id, alias name -> id)."""
    with Session(engine) as s:
        ids = add_graph(s, **vars(graph))  # Graph's fields are add_graph's keywords
        s.commit()
    return ids


# --- running a scenario ----------------------------------------------------------


@dataclass
class Committed:
    """What one committed transaction left, for the checks."""

    event_ids: list[int | None]  # one per change
    changes: list[Change]
    ti: object | None
    new_rows: dict  # (asset_id, dag_id) -> created_at
    timestamps: dict  # event id -> timestamp


@dataclass
class Run:
    graph: Graph
    ids: dict
    committed: list[Committed] = field(default_factory=list)
    not_found_warnings: int = 0
    unknown_changes: int = 0


def _register(session, tx: Transaction, queue_mode: str) -> list:
    if tx.api == "single":
        return [
            register_asset_change(
                task_instance=tx.ti,
                asset=asset_ref(*c.key),
                extra=c.extra,
                source_alias_names=c.alias_names,
                partition_key=c.partition_key,
                session=session,
                queue_mode=queue_mode,
            )
            for c in tx.changes
        ]
    return register_asset_changes(
        session=session,
        changes=[
            AssetChange(
                asset=asset_ref(*c.key),
                extra=c.extra,
                source_alias_names=c.alias_names,
                partition_key=c.partition_key,
            )
            for c in tx.changes
        ],
        task_instance=tx.ti,
        queue_mode=queue_mode,
    )


def _event_timestamps(engine, event_ids) -> dict:
    ids = [e for e in event_ids if e is not None]
    if not ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(AssetEvent.id, AssetEvent.timestamp).where(AssetEvent.id.in_(ids)))
        return dict(rows.all())


def _rows_of(graph: Graph, ids: dict, change: Change) -> set[tuple[int, str]]:
    """The oracle: queue rows one registered change stands for."""
    if not change.known or change.partition_key is not None:
        return set()
    return {(ids[change.key], d) for d in graph.consumers(change.key, change.alias_names)}


def run_scenario(engine, seed: int, queue_mode: str, caplog) -> Run:
    """Set up ``seed``'s graph, run its transactions; check the queue after each one."""
    rng = random.Random(seed)
    graph = make_graph(rng)
    transactions = make_transactions(rng, graph)
    ids, _ = setup_graph(engine, graph)
    run = Run(graph, ids)
    with engine.connect() as conn:
        # The default, "auto": refresh, in the statement or (where the scheduler
        # locks no rows, MariaDB) after COMMIT, which both modes here reach.
        refreshes = dialects.resolve("auto", conn) in ("refresh", "refresh_after_commit")
    expected: set[tuple[int, str]] = set()
    before = queue_rows(engine)
    assert before == {}
    for number, tx in enumerate(transactions):
        caplog.clear()
        with caplog.at_level(logging.WARNING), Session(engine) as session:
            results = _register(session, tx, queue_mode)
            # Ids while the session is open (the objects expire at COMMIT).
            event_ids = [None if e is None else e.id for e in results]
            if tx.rollback:
                session.rollback()
            else:
                session.commit()
        context = f"seed {seed}, {queue_mode} mode, transaction {number} ({tx.api}, rollback={tx.rollback})"
        assert [e is not None for e in event_ids] == [c.known for c in tx.changes], context
        run.unknown_changes += sum(not c.known for c in tx.changes)
        run.not_found_warnings += sum(NOT_FOUND in r.getMessage() for r in caplog.records)

        after = queue_rows(engine)
        if not tx.rollback:
            expected |= {row for c in tx.changes for row in _rows_of(graph, ids, c)}
        missing, unexpected = expected - set(after), set(after) - expected
        assert not missing and not unexpected, (
            f"{context}: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
        timestamps = {} if tx.rollback else _event_timestamps(engine, event_ids)
        # Each row the transaction stands for ends at the newest of its old
        # created_at and its events' timestamps; every other row is unchanged.
        wanted = dict(before)
        if not tx.rollback:
            for event_id, change in zip(event_ids, tx.changes, strict=True):
                for row in _rows_of(graph, ids, change):
                    stamp = timestamps[event_id]
                    if row not in wanted:
                        wanted[row] = stamp  # new: the first event that queued it
                    elif refreshes:
                        wanted[row] = max(wanted[row], stamp)
        wrong = {
            row: (before.get(row), after[row], wanted[row]) for row in after if after[row] != wanted[row]
        }
        assert not wrong, f"{context}: created_at (before, after, expected) differs: {wrong}"
        if not tx.rollback:
            new_rows = {row: after[row] for row in set(after) - set(before)}
            run.committed.append(Committed(event_ids, tx.changes, tx.ti, new_rows, timestamps))
        before = after
    return run


# --- the tests ---------------------------------------------------------------------


@pytest.mark.parametrize("queue_mode", ["commit", "immediate"])
@pytest.mark.parametrize("seed", SEEDS)
def test_rows_match_the_oracle(engine, seed, queue_mode, caplog):
    run = run_scenario(engine, seed, queue_mode, caplog)  # checks the queue after every transaction
    graph, ids = run.graph, run.ids
    assert run.not_found_warnings == run.unknown_changes

    # asset_event: exactly the committed transactions' events of known assets.
    event = AssetEvent.__table__
    with engine.connect() as conn:
        stored = {
            r.id: r
            for r in conn.execute(
                sa.select(
                    event.c.id,
                    event.c.asset_id,
                    event.c.extra,
                    event.c.source_task_id,
                    event.c.source_dag_id,
                    event.c.source_run_id,
                    event.c.source_map_index,
                    event.c.partition_key,
                )
            )
        }
        aliases = stored_aliases(conn)
        alias_names = set(aliases)
        alias_name_of = {i: n for n, i in aliases.items()}
        links = {(alias_name_of[a], s) for a, s in alias_links(conn)}
        alias_events = {(alias_name_of[a], e) for a, e in alias_event_links(conn)}

    expected_events = {}
    expected_alias_events = set()
    expected_links = {(a, ids[k]) for a, k in graph.links}
    expected_alias_names = set(graph.aliases)
    for tx in run.committed:
        # Without a task instance Airflow sets no source field, so source_map_index
        # gets the column's server default, -1.
        source = (
            (None, None, None, -1)
            if tx.ti is None
            else (tx.ti.task_id, tx.ti.dag_id, tx.ti.run_id, tx.ti.map_index)
        )
        for event_id, change in zip(tx.event_ids, tx.changes, strict=True):
            if event_id is None:
                continue
            expected_events[event_id] = (ids[change.key], change.extra or {}, *source, change.partition_key)
            expected_alias_events |= {(a, event_id) for a in change.alias_names}
            expected_links |= {(a, ids[change.key]) for a in change.alias_names}
            expected_alias_names |= set(change.alias_names)

    actual_events = {i: tuple(r)[1:] for i, r in stored.items()}
    assert actual_events == expected_events
    assert alias_names == expected_alias_names
    assert links == expected_links
    assert alias_events == expected_alias_events

    # A new queue row's created_at is never earlier than the event(s) it stands
    # for: Airflow 3.3.2's scheduler attaches to a run the events with
    # timestamp <= the newest created_at, so an earlier created_at would leave
    # the event out of the run it triggered.
    new_rows = 0
    for tx in run.committed:
        for row, created_at in tx.new_rows.items():
            new_rows += 1
            standing = [
                tx.timestamps[e]
                for e, c in zip(tx.event_ids, tx.changes, strict=True)
                if e is not None and row in _rows_of(graph, ids, c)
            ]
            assert standing, f"new row {row} stands for no event of its transaction"
            # immediate: the first such event queued the row; commit: all of them did, at COMMIT.
            bound = standing[0] if queue_mode == "immediate" else max(standing)
            assert created_at >= bound, f"{row}: created_at {created_at} < event timestamp {bound}"
    assert new_rows >= 3, f"seed {seed}: only {new_rows} new queue rows to check"


@pytest.mark.parametrize("seed", SEEDS)
def test_commit_mode_stamps_events_and_new_rows_with_one_value(engine, seed, caplog):
    """In commit mode, just before COMMIT, the transaction's events get their
    ``timestamp`` and its new queue rows their ``created_at``, all ONE value
    (so the scheduler's race window is the commit, not the transaction)."""
    run = run_scenario(engine, seed, "commit", caplog)
    checked = 0
    for number, tx in enumerate(run.committed):
        if not tx.new_rows:
            continue
        checked += 1
        new_assets = {a for a, _ in tx.new_rows}
        stamps = {
            "events": {
                tx.timestamps[e]
                for e, c in zip(tx.event_ids, tx.changes, strict=True)
                if e is not None and c.partition_key is None and run.ids[c.key] in new_assets
            },
            "new rows": set(tx.new_rows.values()),
        }
        # >>> the commit-time stamp: one value for the events and their new rows <<<
        assert len(stamps["events"] | stamps["new rows"]) == 1, (
            f"seed {seed}, committed transaction {number}: events' timestamps and new rows' "
            f"created_at differ: {stamps}"
        )
    # Every seed's scenario commits transactions that queue new rows.
    assert checked >= 3, f"seed {seed}: only {checked} transactions with new rows to check"
