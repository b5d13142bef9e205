"""What doctor returns: the report's dataclasses, the verdicts and their exit codes, :class:`DoctorError`.

:func:`render_text` prints the report on one screen, ending with the config
line to set; :func:`render_json` prints every field.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError

from airflow_adrq.errors import AdrqError

ENABLE = "enable"
NOT_NEEDED = "not needed"
NOT_SUPPORTED = "not supported"
#: Exit status of each verdict (2 is argparse's, for a usage error: never a verdict).
EXIT_CODES = {ENABLE: 0, NOT_NEEDED: 1, NOT_SUPPORTED: 3}
#: Exit status when there is no report: not an Airflow database, or unreadable.
EXIT_NO_REPORT = 4
#: Fan-out thresholds the report counts assets above.
FANOUT_THRESHOLDS = (64, 1024)


class DoctorError(AdrqError):
    """This database cannot be checked."""


@dataclass(frozen=True)
class SchemaVersion:
    """Where ``alembic_version`` puts the database in Airflow's migration history."""

    revision: str
    #: The Airflow release that added this migration (``None``: unknown revision).
    airflow_version: str | None
    #: ``(major, minor)`` of :attr:`airflow_version`.
    line: tuple[int, int] | None
    #: The revision is that release's last migration (else: a migration stopped half-way).
    complete: bool


@dataclass(frozen=True)
class PgBouncer:
    """Whether the connection goes through PgBouncer (``None``: cannot tell), and how that was decided."""

    detected: bool | None
    how: str
    pool_mode: str | None = None
    pool_mode_how: str | None = None


@dataclass
class Compatibility:
    backend: str
    server: str
    schema: SchemaVersion
    #: The primary key of ``asset_dag_run_queue`` as found (``None``: no such table).
    queue_key: tuple[str, ...] | None
    #: :class:`airflow_adrq.shapes.QueueShape` name (``None``: :func:`.compatibility.detect` refused it).
    shape: str | None
    supported: bool
    #: Why (not) supported, one sentence.
    support: str
    #: The supported release lines whose migrations make this shape, e.g. ``["3.2", "3.3"]``.
    shape_lines: list[str] = field(default_factory=list)
    #: The release of the line the plug-in is tested with.
    tested: str | None = None
    #: MySQL/MariaDB: the server's default isolation level, and what Airflow's connections use.
    isolation: str | None = None
    #: Collation of each DAG id column, ``"table.column": collation``.
    dag_id_collations: dict[str, str] = field(default_factory=dict)
    #: MySQL/MariaDB: the queue table's storage engine.
    storage_engine: str | None = None
    pgbouncer: PgBouncer | None = None


@dataclass(frozen=True)
class QueueInsert:
    """One ``pg_stat_statements`` entry that inserts into ``asset_dag_run_queue``."""

    kind: str
    calls: int
    mean_ms: float


@dataclass
class Exposure:
    #: Active assets, and those with at least one consumer DAG.
    assets: int
    assets_with_consumers: int
    #: Consumer DAGs per asset with consumers: max, p50, p99 (nearest rank).
    fanout_max: int
    fanout_p50: int
    fanout_p99: int
    #: Assets with more than N consumer DAGs, for N in :data:`FANOUT_THRESHOLDS`.
    fanout_over: dict[int, int]
    #: Assets with two or more consumer DAGs.
    multi_consumer_assets: int
    #: Assets produced by several tasks / by tasks of several DAGs / of those, with 2+ consumers.
    several_producers: int
    several_producer_dags: int
    racing: int
    #: Tasks with several outlets / of those, queueing 2+ rows per success / sharing a consumer DAG.
    multi_outlet_tasks: int
    multi_outlet_multirow: int
    multi_outlet_shared: int
    #: Aliases / DAG schedule references on aliases / asset links / aliases whose events queue 2+ rows.
    aliases: int
    alias_references: int
    alias_links: int
    alias_multirow: int
    #: PostgreSQL: ``pg_stat_database.deadlocks`` of this database, and since when.
    #: MariaDB: ``Innodb_deadlocks`` (server-wide, since start).
    deadlocks: int | None = None
    deadlocks_scope: str | None = None
    #: PostgreSQL: ``pg_stat_statements`` entries inserting into the queue; ``None`` when unavailable.
    queue_inserts: list[QueueInsert] | None = None
    queue_inserts_note: str | None = None


@dataclass
class Report:
    url: str
    compatibility: Compatibility
    exposure: Exposure | None
    verdict: str
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def count(value: int, singular: str, plural: str | None = None) -> str:
    """``"1 asset"``, ``"1,024 assets"``: the wording the verdict and the text share."""
    return f"{value:,} {singular if value == 1 else plural or singular + 's'}"


def first_line(exc: BaseException) -> str:
    """The first line of an error (the driver's own, under SQLAlchemy's): no SQL, no traceback."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
    if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str):
        # mysqlclient / PyMySQL: (2013, "Lost connection ...") -> a sentence, as psycopg's are.
        return f"{args[1].strip().splitlines()[0]} (MySQL error {args[0]})"
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


CONFIG_LINE = "asset_manager_class = airflow_adrq.airflow.AdrqAssetManager"
_ADVICE = {
    ENABLE: "Enable it, in airflow.cfg on every component that writes asset events:",
    NOT_NEEDED: "Nothing to do; it is safe to enable anyway with:",
    NOT_SUPPORTED: "Do not set (and remove, if set):",
}


def render_text(report: Report) -> str:
    """The report as text, about 25 lines of at most 100 characters."""
    c, e = report.compatibility, report.exposure
    lines = [f"airflow-adrq doctor: {report.url} (read-only)", "", "Compatibility"]

    def wrap(text: str, first: str, rest: str = "    ") -> None:
        lines.extend(textwrap.wrap(text, 100, initial_indent=first, subsequent_indent=rest))

    def row(label: str, value: str | None) -> None:
        if value is not None:
            wrap(value, f"  {label:<19} ", " " * 22)

    row("Airflow schema", f"{c.schema.airflow_version or 'unknown'} (alembic_version {c.schema.revision})")
    key = f"({', '.join(c.queue_key)})" if c.queue_key else "none"
    if c.shape_lines:
        key += f": as in Airflow {', '.join(c.shape_lines)}"
    elif c.shape:
        key += f": {c.shape}"
    row("Queue key", key)
    row("Plug-in", ("supported: " if c.supported else "NOT supported: ") + c.support)
    row("Server", c.server + (f", asset_dag_run_queue on {c.storage_engine}" if c.storage_engine else ""))
    row("Isolation", c.isolation)
    distinct = sorted(set(c.dag_id_collations.values()))
    each = "; ".join(f"{k} {v}" for k, v in c.dag_id_collations.items())
    row("dag_id collation", distinct[0] if len(distinct) == 1 else each or None)
    if (p := c.pgbouncer) is not None:
        if p.detected:
            mode = f"{p.pool_mode} pooling ({p.pool_mode_how})" if p.pool_mode else "pool mode unknown"
            row("PgBouncer", f"yes, {mode}; {p.how}")
        elif p.detected is None:
            row("PgBouncer", f"cannot tell: {p.how}")
        else:
            row("PgBouncer", p.how if p.how.startswith("no") else f"no: {p.how}")
    lines.append("Exposure")
    if e is None:
        lines.append("  n/a: the asset tables are missing")
    else:
        n = "{:,}".format
        over = ", ".join(f">{n(limit)}: {n(k)}" for limit, k in e.fanout_over.items())
        row(
            "Assets",
            f"{n(e.assets)} active, {n(e.assets_with_consumers)} with consumer DAGs "
            "(unpaused; direct, name, URI references)",
        )
        row(
            "Consumers/asset",
            f"max {n(e.fanout_max)}, p50 {n(e.fanout_p50)}, p99 {n(e.fanout_p99)}; assets with {over}",
        )
        row(
            "Several producers",
            f"{count(e.several_producers, 'asset')} ({n(e.several_producer_dags)} by several DAGs), "
            f"{n(e.racing)} of them with 2+ consumer DAGs: these race",
        )
        row(
            "Multi-outlet tasks",
            f"{n(e.multi_outlet_tasks)}; {n(e.multi_outlet_multirow)} queue 2+ rows "
            f"per success; {n(e.multi_outlet_shared)} share a consumer DAG between outlets",
        )
        row(
            "Aliases",
            f"{n(e.aliases)}; {n(e.alias_references)} DAG schedule references, "
            f"{n(e.alias_links)} asset links; {n(e.alias_multirow)} queue 2+ rows per event",
        )
        row("Deadlocks", None if e.deadlocks is None else f"{n(e.deadlocks)} ({e.deadlocks_scope})")
        # Only a backend with pg_stat_statements reports inserts, or why it has none.
        if e.queue_inserts:
            for i, q in enumerate(sorted(e.queue_inserts, key=lambda q: q.kind)):
                row("" if i else "Queue inserts", f"{q.kind}: {n(q.calls)} calls, mean {q.mean_ms:.2f} ms")
        else:
            row("Queue inserts", e.queue_inserts_note and f"n/a: {e.queue_inserts_note}")
    for warning in report.warnings:
        wrap(warning, "  ! ")
    lines.append(f"Verdict: {report.verdict.upper()} (exit {report.exit_code})")
    for reason in report.reasons:
        wrap(reason, "  - ")
    lines.extend([f"  {_ADVICE[report.verdict]}", "    [core]", f"    {CONFIG_LINE}"])
    return "\n".join(lines)


def render_json(report: Report) -> str:
    """The report as JSON (every field of :class:`Report`, plus ``exit_code`` and the config line)."""
    config = {"section": "core", "option": "asset_manager_class", "value": CONFIG_LINE.split(" = ")[1]}
    data = {**dataclasses.asdict(report), "exit_code": report.exit_code, "config": config}
    return json.dumps(data, indent=2, default=str)
