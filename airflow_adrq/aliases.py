"""The alias rows of a transaction's events, written with the queue statement in one global order.

An event emitted through aliases needs ``asset_alias`` and ``asset_alias_asset`` rows (shared
between producers, created if missing) and ``asset_alias_asset_event`` rows (always new). Written
call by call, as Airflow 3.3 does, two transactions creating the same aliases or links in opposite
orders deadlock, and on InnoDB even a no-op ``ON DUPLICATE KEY UPDATE`` locks an *existing* row
exclusively until COMMIT. So :func:`write_alias_rows` runs once per transaction, just before the
queue statement: it reads first, so existing rows are never written, then inserts what is missing
table by table, in key order, with the backend's insert-or-ignore, as multi-row ``VALUES``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection

from airflow_adrq import dialects
from airflow_adrq.tables import asset_alias, asset_alias_asset, asset_alias_asset_event

__all__ = ["ROWS_PER_STATEMENT", "write_alias_rows"]

#: Rows per multi-row INSERT: 2 parameters each, well below SQLite's 32,766
#: and psycopg 3's 65,535 bound parameters.
ROWS_PER_STATEMENT = 5_000

_ALIASES_BY_NAME = select(asset_alias.c.name, asset_alias.c.id).where(
    asset_alias.c.name.in_(bindparam("names", expanding=True))
)
_LINKS = select(asset_alias_asset.c.alias_id, asset_alias_asset.c.asset_id).where(
    asset_alias_asset.c.alias_id.in_(bindparam("alias_ids", expanding=True)),
    asset_alias_asset.c.asset_id.in_(bindparam("asset_ids", expanding=True)),
)
# Lookups bind one expanding list; keep them within the same parameter limits.
_IDS_PER_LOOKUP = 10_000


def write_alias_rows(conn: Connection, rows: Iterable[tuple[int, int, str]]) -> None:
    """Create missing aliases and asset-alias links, then the events' alias rows.

    ``rows``: (event id, asset id, alias name) for each alias an event was emitted through.
    Locks: inserts the missing ``asset_alias`` rows in name order, then the missing
    ``asset_alias_asset`` rows in ``(alias_id, asset_id)`` order, then the
    ``asset_alias_asset_event`` rows (new keys); existing aliases and links are only read (and
    share-locked by the foreign-key checks of the rows that reference them). Does not promise: no
    wait for a concurrent transaction creating the same alias or link (never a cycle among
    transactions that use this function).
    """
    rows = list(rows)
    if not rows:
        return
    backend = dialects.get(conn)
    names = sorted({name for _, _, name in rows})
    alias_ids = _alias_ids(conn, names)
    missing = [name for name in names if name not in alias_ids]
    if missing:
        _insert_sorted(
            conn, backend.insert_ignore(asset_alias), ("name", "group"), [(n, "") for n in missing]
        )
        alias_ids.update(_alias_ids(conn, missing))
    wanted = {(alias_ids[name], asset_id) for _, asset_id, name in rows}
    links = sorted(wanted - _existing_links(conn, wanted))
    if links:
        _insert_sorted(conn, backend.insert_ignore(asset_alias_asset), ("alias_id", "asset_id"), links)
    event_rows = sorted({(alias_ids[name], event_id) for event_id, _, name in rows})
    _insert_sorted(conn, insert(asset_alias_asset_event), ("alias_id", "event_id"), event_rows)


def _alias_ids(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for start in range(0, len(names), _IDS_PER_LOOKUP):
        chunk = list(names[start : start + _IDS_PER_LOOKUP])
        found.update((name, alias_id) for name, alias_id in conn.execute(_ALIASES_BY_NAME, {"names": chunk}))
    return found


def _existing_links(conn: Connection, wanted: set[tuple[int, int]]) -> set[tuple[int, int]]:
    pairs = sorted(wanted)
    found: set[tuple[int, int]] = set()
    # Chunks of pairs: each binds at most _IDS_PER_LOOKUP ids per list.
    for start in range(0, len(pairs), _IDS_PER_LOOKUP):
        chunk = pairs[start : start + _IDS_PER_LOOKUP]
        params = {
            "alias_ids": sorted({alias_id for alias_id, _ in chunk}),
            "asset_ids": sorted({asset_id for _, asset_id in chunk}),
        }
        found.update((alias_id, asset_id) for alias_id, asset_id in conn.execute(_LINKS, params))
    return found & wanted


def _insert_sorted(
    conn: Connection, stmt: Any, columns: tuple[str, str], rows: Sequence[tuple[Any, Any]]
) -> None:
    """``rows`` (in the given order) as multi-row ``VALUES`` of :data:`ROWS_PER_STATEMENT` rows at most."""
    # Not an executemany: drivers send one of INSERT ... ON CONFLICT one row per round trip.
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        conn.execute(stmt.values([dict(zip(columns, row, strict=True)) for row in chunk]))
