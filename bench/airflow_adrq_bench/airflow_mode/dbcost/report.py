"""``--db-cost``'s results: per database the cost of one task success per cell (Markdown, with a legend),
then where the plug-in costs more, traced: per statement (``pg_stat_statements``) and per relation and
WAL record type (``pg_walinspect``); the JSON has every cell's raw counters."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from airflow_adrq_bench import exits, options, tables
from airflow_adrq_bench.airflow_mode.dbcost import mariadb
from airflow_adrq_bench.airflow_mode.report import heading
from airflow_adrq_bench.tables import fmt

Row = dict[str, Any]


def conclude(stem: Path, raw: dict[str, Any]) -> int:
    """Write ``stem.json`` and ``stem.md``, print the cost tables; 1 if a cell's checks failed."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    problems = [p for cell in raw["cells"] for p in _problems(cell)]
    raw["problems"] = problems
    tables.write_json(stem.with_suffix(".json"), raw)
    shown = cost_tables(raw)
    detail = "\n".join([shown, "", traces(raw), "", LEGEND])
    written = [stem.with_suffix(".json")]
    took = raw["duration_s"]
    outcome = exits.judge(problems)
    return options.publish(stem.with_suffix(".md"), detail, written, outcome, took=took, shown=shown)


def _problems(cell: Row) -> list[str]:
    where = f"{cell['db']} {cell['fanout']}/{cell['scenario']}/{cell['callers']}/{cell['manager']}"
    checks, found = cell["checks"], []
    if checks["states"] != {"success": cell["planned"]}:
        found.append(f"{where}: task instance states {checks['states']}, expected all success")
    if checks["events"] != cell["planned"]:
        found.append(f"{where}: {checks['events']} asset events, expected {cell['planned']}")
    if not checks["rows_exact"]:
        found.append(f"{where}: queue rows not exact ({checks['rows']})")
    return found


def successes(cell: Row) -> int:
    """Task successes the cell committed (task instances left SUCCESS)."""
    return int(cell["checks"]["states"].get("success", 0))


def per(cell: Row, value: float) -> float:
    n = successes(cell)
    return value / n if n else float("nan")


def pages(cell: Row, table: str | None = None, *, other: Sequence[str] = ()) -> int:
    """Pages the cell dirtied: of ``table`` (its indexes included), or of every table not in ``other``."""
    return sum(
        d["pages"]
        for d in cell["dirty"]
        if (d["table"] == table if table is not None else d["table"] not in other)
    )


def _n(digits: int = 1) -> Callable[[float], str]:
    return lambda v: fmt(float(v), digits)


def _total(key: str, digits: int = 1) -> Callable[[Row], str]:
    return lambda c: fmt(per(c, c["totals"][key]), digits)


_WHERE: tables.Columns = {
    "F": lambda c: f"{c['fanout']:,}",
    "scenario": "scenario",
    "callers": lambda c: str(c["callers"]),
    "manager": "manager",
    "ok": lambda c: f"{successes(c)}/{c['planned']}",
}
_QUEUE = "asset_dag_run_queue"
POSTGRESQL: tables.Columns = {
    **_WHERE,
    "XIDs": _total("xids", 2),
    "subxacts": _total("committed_subxacts", 2),
    "WAL bytes": _total("wal_bytes", 0),
    "w/o FPIs": lambda c: fmt(per(c, _without_fpis(c["totals"])), 0),
    "records": _total("wal_records", 1),
    "FPIs": _total("wal_fpi", 2),
    "MultiXacts": _total("multixacts", 2),
    "members": _total("multixact_members", 2),
    "dag pages": lambda c: fmt(per(c, pages(c, "dag")), 2),
    "adrq pages": lambda c: fmt(per(c, pages(c, _QUEUE)), 2),
    "other pages": lambda c: fmt(per(c, pages(c, other=("dag", _QUEUE))), 2),
    "stmts": lambda c: fmt(_median(k["statements"] for k in c["calls"]), 0),
    "retries": lambda c: str(sum(k["attempts"] - 1 for k in c["calls"])),
}
MARIADB: tables.Columns = {
    **_WHERE,
    "redo bytes": _total("redo_bytes", 0),
    "trx ids": _total("trx_ids", 2),
    "rw commits": _total("trx_rw_commits", 2),
    "savepoints": _total("Handler_savepoint", 1),
    "to savepoint": _total("Handler_savepoint_rollback", 1),
    "rows written": _total("Handler_write", 1),
    "rows updated": _total("Handler_update", 1),
    "lock requests": _total("lock_rec_lock_requests", 1),
    "dag pages": lambda c: fmt(per(c, pages(c, "dag")), 2),
    "adrq pages": lambda c: fmt(per(c, pages(c, _QUEUE)), 2),
    "undo, system pages": lambda c: fmt(per(c, pages(c, mariadb.NO_TABLE)), 2),
    "all pages": lambda c: fmt(per(c, pages(c)), 2),
    "flushed": _total("buffer_pages_written", 1),
    "stmts": lambda c: fmt(_median(k["statements"] for k in c["calls"]), 0),
    "retries": lambda c: str(sum(k["attempts"] - 1 for k in c["calls"])),
}


def _without_fpis(totals: Row) -> int:
    """WAL record bytes without their full-page images (whose size depends on how full a page is)."""
    return int(totals["wal_record_bytes"] - totals["wal_fpi_bytes"])


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    return float(ordered[len(ordered) // 2]) if ordered else float("nan")


def cost_tables(raw: dict[str, Any]) -> str:
    """Per database: the cost of one task success in every cell (a row per manager)."""
    s = raw["sizes"]
    out = [
        heading("What one task success costs the database, stock AssetManager vs plug-in", raw),
        "",
        f"Per committed task success (Airflow's ti_update_state: TI locked and set SUCCESS, one outlet, "
        f"a log row, COMMIT); one caller: {s['successes']} in a row; concurrent: {s['producers']} "
        f"producers x {s['transactions']}, all on the same F consumer DAGs. Each cell opens with VACUUM "
        "and CHECKPOINT.",
    ]
    for target in raw["targets"]:
        cells = [c for c in raw["cells"] if c["db"] == target["name"]]
        if not cells:
            continue
        columns = POSTGRESQL if cells[0]["backend"] == "postgresql" else MARIADB
        out += ["", f"### {target['version']}", "", tables.table(cells, columns, left=4)]
        firsts = [c for c in cells if c["per_success"] and "wal_bytes" in c["per_success"][0]]
        if firsts:
            out += ["", "One caller: the first success after the CHECKPOINT, and the next ones", ""]
            out.append(tables.table(firsts, _FIRST, left=4))
    return "\n".join(out)


def _first(key: str, digits: int = 0) -> Callable[[Row], str]:
    return lambda c: fmt(float(c["per_success"][0][key]), digits)


def _later(key: str, digits: int = 0) -> Callable[[Row], str]:
    def show(c: Row) -> str:
        rest = c["per_success"][1:]
        return fmt(sum(r[key] for r in rest) / len(rest), digits) if rest else "-"

    return show


_FIRST: tables.Columns = {
    **{k: v for k, v in _WHERE.items() if k != "ok"},
    "1st WAL bytes": _first("wal_bytes"),
    "1st FPIs": _first("wal_fpi"),
    "1st XIDs": _first("xids"),
    "next WAL bytes": _later("wal_bytes"),
    "next w/o FPIs": lambda c: fmt(
        sum(_without_fpis(r) for r in c["per_success"][1:]) / max(1, len(c["per_success"]) - 1), 0
    ),
    "next records": _later("wal_records", 1),
    "next FPIs": _later("wal_fpi", 1),
    "next XIDs": _later("xids", 2),
    "next MultiXacts": _later("multixacts", 2),
}


# --- traces: where the plug-in costs more


def _groups(cells: Sequence[Row]) -> dict[tuple[str, int, str, int], dict[str, Row]]:
    found: dict[tuple[str, int, str, int], dict[str, Row]] = defaultdict(dict)
    for c in cells:
        found[(c["db"], c["fanout"], c["scenario"], c["callers"])][c["manager"]] = c
    return found


def traces(raw: dict[str, Any]) -> str:
    """Per cell pair: the statements (and on PostgreSQL the WAL record kinds), per task success."""
    out = ["## Traces: per statement and per WAL record kind, per task success"]
    for (db, fanout, scenario, callers), pair in _groups(raw["cells"]).items():
        if not {"stock", "plugin"} <= set(pair):
            continue
        title = f"### {db}, F={fanout:,}, {scenario}, {callers} caller(s)"
        if pair["stock"]["backend"] == "postgresql":
            out += ["", title, ""]
            out += [tables.markdown(list(_STATEMENT_HEADER), _statement_rows(pair), left=2), ""]
            out.append(tables.markdown(list(_KIND_HEADER), _kind_rows(pair), left=3))
        elif callers == 1:
            out += ["", title + " (redo per statement)", ""]
            out.append(tables.markdown(["manager", "statement", "calls", "redo bytes"], _redo_rows(pair)))
    return "\n".join(out)


def _redo_rows(pair: dict[str, Row], top: int = 8) -> list[list[str]]:
    """MariaDB, one caller: the redo of each statement the worker sent (:class:`.success.RedoProbe`)."""
    rows = []
    for manager in ("stock", "plugin"):
        cell = pair[manager]
        merged: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for call in cell["calls"]:
            for text, (calls, redo) in call.get("redo", {}).items():
                merged[text][0] += calls
                merged[text][1] += redo
        ranked = sorted(merged.items(), key=lambda kv: -kv[1][1])
        for text, (calls, redo) in ranked[:top]:
            rows.append([manager, text, fmt(per(cell, calls), 2), fmt(per(cell, redo), 0)])
        rest = per(
            cell, sum(r["redo_bytes"] for r in cell["per_success"]) - sum(v[1] for v in merged.values())
        )
        rows.append([manager, "(after the call: purge)", "", fmt(rest, 0)])
    return rows


_STATEMENT_HEADER = ("manager", "statement", "calls", "WAL bytes", "records", "FPIs", "dirtied")
_KIND_HEADER = (
    "relation",
    "table",
    "record",
    "stock rec",
    "plugin rec",
    "stock B",
    "plugin B",
    "+B",
    "stock FPIs",
    "plugin FPIs",
)


def label(query: str) -> str:
    """A statement, short: its first words, the table it writes or reads."""
    text = re.sub(r"\s+", " ", query).strip()
    if text.upper().startswith("WITH") and "UPDATE asset_event" in text:
        return "plug-in: WITH ... FOR SHARE ... INSERT adrq ... UPDATE asset_event"
    if "FOR KEY SHARE" in text:
        table = re.search(r'FROM ONLY "?\w+"?\."?(\w+)"?', text)
        return f"(nested FK check) SELECT ... {table[1] if table else ''} FOR KEY SHARE"
    return text[:70] + ("..." if len(text) > 70 else "")


def _statement_rows(pair: dict[str, Row], top: int = 8) -> list[list[str]]:
    rows = []
    for manager in ("stock", "plugin"):
        cell = pair[manager]
        merged: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
        for s in cell["statements"]:
            sums = merged[label(s["query"])]
            for i, key in enumerate(("calls", "wal_bytes", "wal_records", "wal_fpi", "shared_blks_dirtied")):
                sums[i] += float(s[key])
        ranked = sorted(merged.items(), key=lambda kv: (-kv[1][1], -kv[1][4]))
        top_level = sum(float(s["wal_bytes"]) for s in cell["statements"] if s["toplevel"])
        for text, (calls, wal, records, fpi, dirtied) in ranked[:top]:
            shown = [per(cell, v) for v in (calls, wal, records, fpi, dirtied)]
            rows.append([manager, text, *(fmt(v, d) for v, d in zip(shown, (2, 0, 1, 2, 2), strict=True))])
        residual = per(cell, cell["totals"]["wal_record_bytes"] - top_level)
        rows.append([manager, "(in no statement: commit records ...)", "", fmt(residual, 0), "", "", ""])
    return rows


def _kind_rows(pair: dict[str, Row], top: int = 12) -> list[list[str]]:
    kinds: dict[tuple[str, str, str], dict[str, tuple[float, ...]]] = defaultdict(dict)
    for manager in ("stock", "plugin"):
        cell = pair[manager]
        for k in cell["wal"]:
            key = (k["relation"], k["table"], f"{k['rmgr']}/{k['type']}")
            sums = (k["records"], k["bytes"] - k["fpi_bytes"], k["fpi"])
            kinds[key][manager] = tuple(per(cell, v) for v in sums)
    rows = []
    for (relation, table, record), found in kinds.items():
        stock, plugin = found.get("stock", (0.0, 0.0, 0.0)), found.get("plugin", (0.0, 0.0, 0.0))
        diff = plugin[1] - stock[1]
        cells = [fmt(stock[0], 2), fmt(plugin[0], 2), fmt(stock[1], 0), fmt(plugin[1], 0), f"{diff:+,.0f}"]
        cells += [fmt(stock[2], 2), fmt(plugin[2], 2)]
        rows.append((abs(diff) + abs(plugin[2] - stock[2]), [relation, table, record, *cells]))
    return [r for _, r in sorted(rows, key=lambda r: -r[0])[:top]]


LEGEND = """Legend

* Every figure is per committed task success: the cell's total divided by the task instances it left
  SUCCESS (`ok`). A cell opens with VACUUM of the tables it writes and CHECKPOINT (every page clean, its
  next change logs a full-page image) and, on PostgreSQL, a pg_stat_statements reset.
* PostgreSQL: XIDs = pg_snapshot_xmax(pg_current_snapshot()) delta (cross-checked against
  pg_control_checkpoint()'s next_xid in the JSON: `control`); subxacts = subtransaction XIDs listed in
  the COMMIT records; WAL bytes = pg_current_wal_lsn() delta; records, FPIs (full-page images), FPI
  bytes, MultiXacts (MultiXact/CREATE_ID records) and members: pg_walinspect over that range
  (MultiXacts and member slots also as pg_control_checkpoint() deltas in the JSON); pages = distinct
  buffers pg_buffercache shows dirty at the cell's end, per table with its indexes (`other`: every
  other table, catalogs included); stmts = statements one success sends (median); retries = a task
  success called again after a retryable error raised out of the route.
* MariaDB: redo bytes = Innodb_lsn_current delta, purge caught up on both sides; trx ids = InnoDB's
  Trx id counter delta (a read-write transaction's id and its commit number: 2 per transaction); rw
  commits, lock requests (record lock requests), flushed (pages written during the cell: a page flushed
  early is missing from `pages`): INNODB_METRICS; savepoints / to savepoint / rows written / rows
  updated: Handler_savepoint / Handler_savepoint_rollback / Handler_write / Handler_update (internal
  temporary tables' rows included); pages = pages modified at the end (not flushed), per table
  (`undo, system`: pages of no table, mostly the rollback segment headers).
* Traces, MariaDB (one caller): the redo LSN read before and after each statement the producer sent;
  `(between statements)` is what the server wrote between them (COMMIT: from the COMMIT on);
  `(after the call: purge)` = the success's redo minus its statements', written once purge caught up.
* Traces (PostgreSQL): per statement, from pg_stat_statements (track = all: a foreign-key check is a
  nested statement, its WAL counted in its INSERT's too); `in no statement` = WAL record bytes outside
  every top-level statement (COMMIT records, written after the COMMIT statement's own accounting).
  Per relation and record kind, from pg_walinspect (a record counts for the first block it names;
  `-` = none: commit, MultiXact records); `+B` = plugin minus stock bytes, the largest first."""
