"""PostgreSQL's counters of one cell, read by the controller around the task successes.

The cluster is a throwaway of its own (:data:`SETTINGS`): nothing else writes WAL, takes XIDs or dirties
pages there, autovacuum is off, the background writer writes nothing and no checkpoint comes but ours.
What each figure is and how it is read:

* **XIDs**: ``pg_snapshot_xmax(pg_current_snapshot())`` before and after (with no transaction open it is
  the next XID to assign; reading it takes none); cross-checked by ``next_xid`` of
  ``pg_control_checkpoint()``, read after a ``CHECKPOINT`` on each side.
* **WAL**: bytes are the ``pg_current_wal_lsn()`` delta; records, full-page images (FPIs) and their
  bytes, per relation (the first block a record references) and record type, are read back with
  ``pg_walinspect``'s ``pg_get_wal_records_info`` over that LSN range. ``MultiXact/CREATE_ID`` records
  count the MultiXacts created and their members; ``Transaction/COMMIT`` records list subtransactions.
* **MultiXacts**: ``next_multixact_id`` and ``next_multi_offset`` (member slots used) of
  ``pg_control_checkpoint()`` after a ``CHECKPOINT`` on each side.
* **Pages dirtied**: every buffer is clean after the ``CHECKPOINT`` that opens the cell; the buffers
  ``pg_buffercache`` shows dirty after it are the distinct pages the cell dirtied, per relation.
* **Per statement**: ``pg_stat_statements`` (``track = all``: the foreign-key checks' nested queries too),
  reset as the cell opens: ``wal_bytes``, ``wal_records``, ``wal_fpi``, ``shared_blks_dirtied``. A COMMIT's
  own record is written after its statement ends: counted in the cell, in no statement.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any, NamedTuple

import sqlalchemy as sa

#: The throwaway cluster's settings (the test support's throwaway turns durability and FPIs off).
SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_utility": "on",
    "pg_stat_statements.max": "10000",
    # As in production: an FPI at a page's first change after a checkpoint; commits wait for their WAL
    # (so pg_walinspect can read up to the last commit at once).
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "track_wal_io_timing": "on",
    # Nothing but the cells writes: no autovacuum, no background-writer writes, our checkpoints only.
    "autovacuum": "off",
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "1d",
    "max_wal_size": "20GB",
    "wal_keep_size": "4GB",
}
EXTENSIONS = ("pg_stat_statements", "pg_walinspect", "pg_buffercache")
#: The tables a cell writes (and the queue it empties), vacuumed before its CHECKPOINT.
TABLES = ("asset_dag_run_queue", "asset_event", "task_instance", "dag_run", "log", "dag", "asset")


class Mark(NamedTuple):
    """Where the cluster is: the WAL insert location and the next XID."""

    lsn: str
    xid: int


def prepare(engine: sa.Engine) -> None:
    """The extensions the counters read, in the scratch database."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for name in EXTENSIONS:
            conn.exec_driver_sql(f"CREATE EXTENSION IF NOT EXISTS {name}")


def settle(engine: sa.Engine) -> None:
    """Once, after seeding: VACUUM every table, catalogs included (no page left to prune later)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM")


def open_cell(engine: sa.Engine) -> dict[str, Any]:
    """Vacuum, ``CHECKPOINT`` (every page clean, FPIs due), reset the statements; where the cell starts."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM {', '.join(TABLES)}")
        conn.exec_driver_sql("CHECKPOINT")
        conn.exec_driver_sql("SELECT pg_stat_statements_reset()")
        return {"control": _control(conn), "mark": mark(conn)}


def mark(conn: sa.Connection) -> Mark:
    row = conn.exec_driver_sql(
        "SELECT pg_current_wal_lsn()::text, pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
    ).one()
    return Mark(str(row[0]), int(row[1]))


def between(conn: sa.Connection, start: Mark, end: Mark) -> dict[str, Any]:
    """What one task success (or any span) cost: XIDs, WAL bytes, records and FPIs, MultiXacts."""
    wal = _wal_records(conn, start.lsn, end.lsn)
    return {"xids": end.xid - start.xid, "wal_bytes": _lsn_bytes(start.lsn, end.lsn), **_sums(wal)}


def close_cell(engine: sa.Engine, opened: dict[str, Any]) -> dict[str, Any]:
    """Everything the cell cost since :func:`open_cell`; ends with a ``CHECKPOINT``."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        end, start = mark(conn), opened["mark"]
        names = _relations(conn)
        wal = _wal_records(conn, start.lsn, end.lsn)
        dirty = [
            {
                "relation": names.get(int(node), (str(node), "?"))[0],
                "table": _table(names, int(node)),
                "pages": n,
            }
            for node, n in conn.exec_driver_sql(_DIRTY)
        ]
        statements = [dict(row) for row in conn.exec_driver_sql(_STATEMENTS).mappings()]
        conn.exec_driver_sql("CHECKPOINT")
        after = _control(conn)
    before = opened["control"]
    totals = {"xids": end.xid - start.xid, "wal_bytes": _lsn_bytes(start.lsn, end.lsn), **_sums(wal)}
    control = {k: after[k] - before[k] for k in after}
    by_kind: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for rec in wal:
        relation = names.get(rec.node, (str(rec.node), "?"))[0] if rec.node else "-"
        sums = by_kind[(relation, rec.rmgr, rec.kind)]
        for i, value in enumerate((1, rec.length, rec.fpis, rec.fpi_length)):
            sums[i] += value
    kinds = [
        {"relation": r, "table": _table_by_name(names, r), "rmgr": g, "type": t}
        | dict(zip(("records", "bytes", "fpi", "fpi_bytes"), v, strict=True))
        for (r, g, t), v in sorted(by_kind.items(), key=lambda kv: -kv[1][1])
    ]
    return {"totals": totals, "control": control, "wal": kinds, "dirty": dirty, "statements": statements}


# --- reading


class _Record(NamedTuple):
    xid: int
    rmgr: str
    kind: str
    length: int
    fpi_length: int
    fpis: int
    node: int  # the relfilenode of the first block referenced; 0: none
    description: str


_BLOCK = re.compile(r"rel \d+/\d+/(\d+)")


def _wal_records(conn: sa.Connection, start: str, end: str) -> list[_Record]:
    """Every WAL record in ``[start, end)``, once WAL up to ``end`` is flushed (as pg_walinspect needs)."""
    if start == end:  # nothing written (pg_walinspect refuses a start at the end of WAL)
        return []
    for _ in range(100):  # the WAL writer flushes within wal_writer_delay (200 ms)
        if conn.exec_driver_sql(f"SELECT pg_current_wal_flush_lsn() >= '{end}'::pg_lsn").scalar():
            break
        time.sleep(0.05)
    rows = conn.exec_driver_sql(
        "SELECT xid::text::bigint, resource_manager, record_type, record_length, fpi_length, "
        "description, coalesce(block_ref, '') FROM pg_get_wal_records_info(%(start)s, %(end)s)",
        {"start": start, "end": end},
    )
    out = []
    for xid, rmgr, kind, length, fpi_length, description, blocks in rows:
        node = _BLOCK.search(blocks)
        fpis = blocks.count("FPW")
        out.append(
            _Record(int(xid), rmgr, kind, length, fpi_length, fpis, int(node[1]) if node else 0, description)
        )
    return out


_MULTI = re.compile(r"nmembers (\d+)")
_SUBXACTS = re.compile(r"subxacts: ([\d ]+)")


def _sums(wal: list[_Record]) -> dict[str, int]:
    multis = [r for r in wal if r.rmgr == "MultiXact" and r.kind == "CREATE_ID"]
    commits = [r for r in wal if r.rmgr == "Transaction" and r.kind.startswith("COMMIT")]
    subxacts = sum(len(m[1].split()) for r in commits if (m := _SUBXACTS.search(r.description)))
    return {
        "wal_records": len(wal),
        "wal_record_bytes": sum(r.length for r in wal),
        "wal_fpi": sum(r.fpis for r in wal),
        "wal_fpi_bytes": sum(r.fpi_length for r in wal),
        "multixacts": len(multis),
        "multixact_members": sum(int(m[1]) for r in multis if (m := _MULTI.search(r.description))),
        "commits": len(commits),
        "committed_subxacts": subxacts,
        "aborts": sum(1 for r in wal if r.rmgr == "Transaction" and r.kind.startswith("ABORT")),
        "wal_xids": len({r.xid for r in wal if r.xid}),
    }


def _lsn_bytes(start: str, end: str) -> int:
    def value(lsn: str) -> int:
        high, low = lsn.split("/")
        return (int(high, 16) << 32) + int(low, 16)

    return value(end) - value(start)


def _control(conn: sa.Connection) -> dict[str, int]:
    """The last checkpoint's next XID, next MultiXact id and next member offset."""
    row = conn.exec_driver_sql(
        "SELECT next_xid, next_multixact_id::text, next_multi_offset::text FROM pg_control_checkpoint()"
    ).one()
    return {
        "next_xid": int(str(row[0]).rpartition(":")[2]),
        "next_multixact_id": int(row[1]),
        "next_multi_offset": int(row[2]),
    }


def _relations(conn: sa.Connection) -> dict[int, tuple[str, str]]:
    """Per relfilenode of this database: the relation's name and the table it belongs to (an index's
    table, a TOAST table's owner)."""
    rows = conn.exec_driver_sql(
        "SELECT pg_relation_filenode(c.oid), c.relname, coalesce(t.relname, o.relname, c.relname) "
        "FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid "
        "LEFT JOIN pg_class t ON t.oid = i.indrelid "
        "LEFT JOIN pg_class o ON o.reltoastrelid = coalesce(i.indrelid, c.oid) AND c.relkind <> 'r' "
        "WHERE pg_relation_filenode(c.oid) IS NOT NULL"
    )
    return {int(node): (str(name), str(table)) for node, name, table in rows}


def _table(names: dict[int, tuple[str, str]], node: int) -> str:
    return names.get(node, ("", "?"))[1]


def _table_by_name(names: dict[int, tuple[str, str]], relation: str) -> str:
    for name, table in names.values():
        if name == relation:
            return table
    return "-" if relation == "-" else "?"


_DIRTY = (
    "SELECT relfilenode, count(*) FROM pg_buffercache WHERE isdirty AND reldatabase IN "
    "(0, (SELECT oid FROM pg_database WHERE datname = current_database())) GROUP BY 1 ORDER BY 2 DESC"
)
_STATEMENTS = (
    # The plug-in's statement is long: its start and its end (UPDATE asset_event ... RETURNING) tell it.
    "SELECT CASE WHEN length(query) > 700 THEN left(query, 300) || ' ... ' || right(query, 400) "
    "ELSE query END AS query, toplevel, calls, wal_bytes::bigint AS wal_bytes, wal_records, "
    "wal_fpi, shared_blks_dirtied, shared_blks_written, rows FROM pg_stat_statements "
    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND (wal_bytes > 0 OR shared_blks_dirtied > 0 OR query ~* '^(savepoint|release|rollback)') "
    "ORDER BY wal_bytes DESC, shared_blks_dirtied DESC"
)
