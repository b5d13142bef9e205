"""What doctor returns: the report's dataclasses, the verdicts and their exit codes, :class:`DoctorError`."""

from __future__ import annotations

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
    #: :class:`airflow_adrq.shapes.QueueShape` name (``None``: :func:`.shape.detect` refused it).
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
