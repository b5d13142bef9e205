"""``--standby``'s results: per phase and per manager, the verdict, and the files (standby.md, .json).

The terminal gets the per-manager table and the verdict (each line within 100 columns); the
Markdown adds the per-phase detail, every wait event sampled and the legend."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from airflow_adrq_bench import options, tables
from airflow_adrq_bench.airflow_mode.report import heading, raw_finish
from airflow_adrq_bench.airflow_mode.standby.observe import Observed
from airflow_adrq_bench.stats import latency
from airflow_adrq_bench.tables import fmt, ratio, times
from airflow_adrq_bench.verdict import NOT_COMMITTED, Line, Target, format_verdict, line, missed

Row = dict[str, Any]
#: The wait events of the stall GitLab and postgres.ai describe (LWLock and IO), shown on their own.
STALL: Final = ("SubtransSLRU", "SubtransBuffer", "SLRURead")
#: The target of issue 39.
P99: Final = Target("standby reader p99 vs stock", "<= 1.2x", lambda v: v <= 1.2)
STREAMED: Final = Target("standby streamed, rows as primary's", "yes", lambda v: v == 1)
_DB = "pg standby"


def transactions(txs: Sequence[Row]) -> Row:
    """A phase's producer transactions: committed, given up, SAVEPOINTs sent, failures by kind."""
    ok = [tx for tx in txs if tx["ok"]]
    failures: Counter[str] = Counter()
    for tx in txs:
        failures.update(tx["failures"])
    latencies = latency([tx["latency_s"] * 1000 for tx in ok])
    return {
        "planned": len(txs),
        "committed": len(ok),
        "abandoned": len(txs) - len(ok),
        "savepoints": sum(tx.get("savepoints", 0) for tx in ok),
        "rollbacks_to": sum(tx.get("rollbacks_to", 0) for tx in ok),
        # Subtransactions one task success opened, at most (replays of the whole transaction
        # included): 64 XIDs in one transaction would make the standby's snapshots suboverflowed.
        "max_subxacts_per_tx": max(
            (tx.get("savepoints", 0) + tx.get("rollbacks_to", 0) for tx in ok), default=0
        ),
        "failures": dict(failures),
        "commit_p50_ms": latencies["p50_ms"],
        "commit_p99_ms": latencies["p99_ms"],
    }


def reader(observed: Observed) -> Row:
    """A phase's reads on the standby: latencies per query and pass (summary and raw), waits sampled."""
    waits = [
        {"backend": k, "type": t, "event": e, "count": n} for (k, t, e), n in observed.waits.most_common()
    ]
    return {
        "passes": len(observed.latencies_ms["pass"]),
        "queue_rows_seen": observed.queue_rows_seen,
        "errors": dict(observed.errors),
        "latency": {name: latency(values) for name, values in observed.latencies_ms.items()},
        "pass_ms": [round(v, 3) for v in observed.latencies_ms["pass"]],
        "samples": observed.samples,
        "waits": waits,
    }


def _waits(phases: Sequence[Row], events: Sequence[str] | None = None) -> int:
    """Samples of a waiting process over ``phases``: of ``events``, or of any LWLock or IO wait."""
    found = [w for p in phases for w in p["reader"]["waits"]]
    if events is not None:
        return sum(w["count"] for w in found if w["event"] in events)
    return sum(w["count"] for w in found if w["type"] in ("LWLock", "IO"))


def _subtrans(phases: Sequence[Row], side: str, counter: str) -> int:
    return sum(p["slru"][side].get("Subtrans", {}).get(counter, 0) for p in phases)


def summarize(phases: Sequence[Row]) -> list[Row]:
    """Per (manager, overflowed): the passes of all its phases pooled, the waits and counters added."""
    rows = []
    for overflowed in (False, True):
        for manager in dict.fromkeys(p["manager"] for p in phases):
            mine = [p for p in phases if p["manager"] == manager and p["overflowed"] == overflowed]
            if not mine:
                continue
            passes = [v for p in mine for v in p["reader"]["pass_ms"]]
            rows.append(
                {
                    "manager": manager,
                    "overflowed": overflowed,
                    "phases": len(mine),
                    "committed": sum(p["transactions"]["committed"] for p in mine),
                    "abandoned": sum(p["transactions"]["abandoned"] for p in mine),
                    "tx_per_s": sum(p["transactions"]["committed"] for p in mine)
                    / sum(p["duration_s"] for p in mine),
                    "savepoints": sum(p["transactions"]["savepoints"] for p in mine),
                    "xids": sum(p["xids"] for p in mine),
                    **latency(passes),
                    "stall_waits": _waits(mine, STALL),
                    "lwlock_io_waits": _waits(mine),
                    "samples": sum(p["reader"]["samples"] for p in mine),
                    **{f"subtrans_{c}": _subtrans(mine, "standby", f"blks_{c}") for c in ("hit", "read")},
                    "primary_subtrans_zeroed": _subtrans(mine, "primary", "blks_zeroed"),
                }
            )
    for row in rows:
        stock = next(
            (r for r in rows if r["manager"] == "stock" and r["overflowed"] == row["overflowed"]), {}
        )
        row["p99_vs_stock"] = ratio(row["p99_ms"], stock.get("p99_ms", math.nan))
    return rows


#: How the tables name a manager (``+ovf``: after the overflow transaction).
_SHORT: Final = {"plugin_ignore": "ignore"}


def _label(row: Row) -> str:
    name = str(row["manager"])
    return _SHORT.get(name, name) + ("+ovf" if row["overflowed"] else "")


def _three(row: Row, digits: int = 1) -> str:
    return "/".join(fmt(row[f"{q}_ms"], digits) for q in ("p50", "p99", "max"))


#: The terminal's table (the Markdown adds the transactions committed): within 100 columns.
_SUMMARY: tables.Columns = {
    "manager": _label,
    "savepts": "savepoints",
    "pass p50/p99/max ms": _three,
    "p99 x": lambda r: times(r["p99_vs_stock"]),
    "Subtrans waits": "stall_waits",
    "Subtrans hit/read": lambda r: f"{fmt(r['subtrans_hit'])}/{fmt(r['subtrans_read'])}",
}
_SUMMARY_MD: tables.Columns = {**_SUMMARY, "tx ok": "committed", "tx/s": "tx_per_s", "XIDs": "xids"}


def _query(query: str, phase: Row) -> str:
    return _three(phase["reader"]["latency"][query])


_PHASES: tables.Columns = {
    "#": lambda p: str(p["phase"] + 1),
    "manager": _label,
    "s": lambda p: fmt(p["duration_s"], 0),
    "tx ok/planned": lambda p: f"{p['transactions']['committed']}/{p['transactions']['planned']}",
    "savepoints": lambda p: fmt(p["transactions"]["savepoints"]),
    "ROLLBACK TO": lambda p: fmt(p["transactions"].get("rollbacks_to", 0)),
    "subxacts/tx max": lambda p: fmt(p["transactions"].get("max_subxacts_per_tx", 0)),
    "XIDs": lambda p: fmt(p["xids"]),
    "queue ins/upd/del": lambda p: "/".join(
        fmt(p.get("queue_table", {}).get(k, 0)) for k in ("inserted", "updated", "deleted")
    ),
    "open tx age (XIDs, s)": lambda p: (
        f"{fmt(p['open_transaction_age']['xids_since'])}, {p['open_transaction_age']['seconds']:.0f}"
    ),
    "passes": lambda p: fmt(p["reader"]["passes"]),
    "queue rows seen": lambda p: fmt(p["reader"]["queue_rows_seen"]),
    **{f"{q} p50/p99/max ms": functools.partial(_query, q) for q in ("pass", "adrq", "dags", "events")},
    "SubtransSLRU/Buffer/SLRURead": lambda p: "/".join(str(_waits([p], [e])) for e in STALL),
    "other LWLock+IO": lambda p: str(_waits([p]) - _waits([p], STALL)),
    "standby Subtrans hit/read": lambda p: "/".join(
        fmt(p["slru"]["standby"].get("Subtrans", {}).get(f"blks_{c}", 0)) for c in ("hit", "read")
    ),
    "primary Subtrans zeroed": lambda p: fmt(p["slru"]["primary"].get("Subtrans", {}).get("blks_zeroed", 0)),
    "replay catch-up s": lambda p: fmt(p["replay_catch_up_s"], 2),
}

_LEGEND = """\
### Legend

* A phase: one manager's producers (the other manager's idle) at the run's rate; phases go ABBA.
  ignore: the plug-in with `[core] asset_manager_kwargs = {"on_conflict": "ignore"}` (ON CONFLICT
  DO NOTHING, as stock; its default on PostgreSQL, refresh, updates every queued row at each event).
  `+ovf`: after the --overflow-control transaction (65 subtransactions): the standby's snapshots
  are then suboverflowed while the open transaction lasts, so every visibility check of an XID
  newer than its xmin looks the XID up in pg_subtrans. Phases without +ovf are the comparison.
* pass: one reader's scheduler pass (adrq: queue rows joined with dag and asset; dags: the dag
  scan; events: one consumer's events of the last consume interval), all readers pooled.
* savepoints: SAVEPOINT statements the committed transactions sent (each a subtransaction);
  ROLLBACK TO: their ROLLBACK TO SAVEPOINT (each starts another); subxacts/tx max: the most of
  both in one task success (its replays included): 64 in one transaction overflow the standby.
  XIDs: assigned on the primary during the phase, by everyone (background writers included).
  queue ins/upd/del: row versions of asset_dag_run_queue written on the primary during the phase
  (pg_stat_user_tables): none can be vacuumed while the transaction is open, so every later pass
  on the standby scans them all (the adrq column's growth through the run).
  open tx age: XIDs assigned since the open transaction's own, and its age in seconds.
* Subtrans waits (per manager) / SubtransSLRU/Buffer/SLRURead (per phase): samples of a standby
  process waiting on that LWLock or IO event (one sample every sample_ms per waiting process).
* standby Subtrans hit/read: pg_stat_slru deltas on the standby: pg_subtrans pages found in
  its 32 buffers / read from disk; 0/0: no reader looked an XID up in pg_subtrans.
  primary Subtrans zeroed: pages the primary started (one per 2,048 XIDs).
"""


def format_summary(raw: dict[str, Any], summary: Sequence[Row], columns: tables.Columns = _SUMMARY) -> str:
    """The per-manager table (``_SUMMARY``: within 100 columns)."""
    s = raw["sizes"]
    head = (
        f"{s['producers']} producers per manager at {s['rate']:g} tx/s, fan-out {s['fanout']} "
        f"({'one asset' if s.get('shared_asset') else 'an asset each'}), "
        f"{s['readers']} standby readers; phases of {s['phase_s']:g} s"
    )
    return f"{head}\n\n{tables.table(summary, columns, left=1)}\n"


def format_detail(raw: dict[str, Any], summary: Sequence[Row]) -> str:
    """The Markdown: heading, settings, the summary, the phases, every wait event, the legend."""
    target = raw["targets"][0] if raw["targets"] else {}
    out = [heading("airflow-adrq bench --airflow --standby", raw), ""]
    settings = "; ".join(
        f"{side}: " + ", ".join(f"{k}={v}" for k, v in kv.items()) for side, kv in raw["cluster"].items()
    )
    out += [f"{target.get('version', 'PostgreSQL')}; {settings}", ""]
    if target:
        age = target.get("open_transaction_age", {})
        out.append(
            f"Open transaction (XID {target.get('open_transaction_xid')}): at the end "
            f"{fmt(age.get('xids_since'))} XIDs old, {age.get('seconds', 0):.0f} s. "
            f"Other writers: {target.get('writers')}.\n"
        )
    out += [format_summary(raw, summary, _SUMMARY_MD), tables.table(raw["phases"], _PHASES, left=2), ""]
    waits = [{"phase": p["phase"] + 1, **w} for p in raw["phases"] for w in p["reader"]["waits"]]
    if waits:
        columns: tables.Columns = {"phase": lambda w: str(w["phase"]), "backend": "backend", "type": "type"}
        columns = {**columns, "event": "event", "samples": "count"}
        out += [
            "Every wait event sampled on the standby (not idle):\n",
            tables.table(waits, columns, left=4),
            "",
        ]
    out.append(_LEGEND)
    return "\n".join(out)


def verdict(raw: dict[str, Any], summary: Sequence[Row]) -> list[Line]:
    """The p99 target (phases before any overflow), the standby's checks, the plug-in's commits."""
    lines = []
    rows = {r["manager"]: r for r in summary if not r["overflowed"]}
    for manager, what in (("plugin", ""), ("plugin_ignore", " (on_conflict=ignore)")):
        mine, stock = rows.get(manager), rows.get("stock")
        if mine and stock:
            shown = f"{times(mine['p99_vs_stock'])} ({fmt(mine['p99_ms'], 1)} / {fmt(stock['p99_ms'], 1)} ms)"
            lines.append(line(_DB, P99, mine["p99_vs_stock"], shown, P99.what + what))
            failed = mine["abandoned"]
            shown = f"{failed} of {mine['committed'] + failed}"
            lines.append(line(_DB, NOT_COMMITTED, failed, shown, NOT_COMMITTED.what + what))
    ok = not checks_failed(raw)
    lines.append(line(_DB, STREAMED, float(ok), "yes" if ok else "NO"))
    return lines


def checks_failed(raw: dict[str, Any]) -> list[str]:
    """What says the standby did not stream or its rows differ from the primary's (empty: none)."""
    found = []
    for target in raw["targets"]:
        counts = target.get("counts", {})
        if counts.get("primary") != counts.get("standby"):
            found.append(f"the standby's rows differ from the primary's: {counts}")
        if not [r for r in target.get("replication", []) if r.get("state") == "streaming"]:
            found.append("no pg_stat_replication row in state streaming on the primary")
        if not target.get("standby_in_recovery"):
            found.append("the standby is not in recovery")
    if not raw["targets"]:
        found.append("nothing measured")
    if not any(p["reader"]["queue_rows_seen"] for p in raw["phases"]):
        found.append("no reader on the standby ever saw a queue row")
    return found


def conclude(out: Path, raw: dict[str, Any], *, check: bool, started: float) -> int:
    """Summarize, write ``standby.json`` and ``standby.md``, print the summary and the verdict; the
    exit status: 1 if a check failed (with ``check``: also if the target was missed)."""
    raw_finish(raw, started)
    summary = summarize(raw["phases"])
    lines = verdict(raw, summary)
    problems = checks_failed(raw)
    if check:
        problems += [f"target missed: {m.what}: {m.measured} (target {m.goal})" for m in missed(lines)]
    raw |= {"summary": summary, "verdict": [vars(ln) for ln in lines], "problems": problems}
    out.mkdir(parents=True, exist_ok=True)
    tables.write_json(out / "standby.json", raw)
    shown = f"{format_summary(raw, summary)}\n{format_verdict(lines)}"
    (out / "standby.md").write_text(f"{format_detail(raw, summary)}\n{format_verdict(lines)}")
    print(shown)
    print(f"took {raw['duration_s']:.0f} s; wrote, in {out}:\n  standby.md\n  standby.json")
    for problem in problems:
        options.say(f"ERROR: {problem}")
    return 1 if problems else 0
