"""The ``airflow-adrq`` command line: ``db upgrade|downgrade|current|check``, ``doctor``, and more.

``db`` manages a database of airflow-adrq's own and refuses Airflow's (:mod:`airflow_adrq.migrate`); its
``--url`` defaults to ``$AIRFLOW_ADRQ_DATABASE_URL`` (keeps passwords out of ``ps``). ``doctor``:
:mod:`airflow_adrq.doctor`. A subcommand here is an ``add_<name>_parser(subparsers)`` that sets ``func``,
a handler returning the exit status. Other distributions add commands through the entry-point group
:data:`COMMANDS_GROUP` (``name = "module:main"``, ``main(argv) -> int`` parsing its own options), as
``airflow-adrq-bench`` adds ``bench``: this package never imports the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from airflow_adrq import __version__, doctor, migrate
from airflow_adrq.doctor.report import first_line
from airflow_adrq.errors import AdrqError

__all__ = ["COMMANDS_GROUP", "EXIT_COULD_NOT_RUN", "URL_ENV", "build_parser", "main", "one_line"]

#: Environment variable that ``--url`` defaults to.
URL_ENV = "AIRFLOW_ADRQ_DATABASE_URL"
#: Entry-point group of commands other distributions add (see the module docstring).
COMMANDS_GROUP = "airflow_adrq.commands"

#: ``db``'s exit status when it could not run (no server or driver, a refused database, an error):
#: the same as ``doctor``'s "no report". 0 is success, 1 ``db check``'s "not at head or not identical",
#: 2 a usage error (argparse's), 130 interrupted.
EXIT_COULD_NOT_RUN = 4


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (:data:`EXIT_COULD_NOT_RUN` and the codes beside it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        external = _external_commands()
        if argv[:1] and argv[0] in external:
            # The command parses its own options (and imports its own code).
            status: int = external[argv[0]].load()(argv[1:])
            return status
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            # Reported by the command that was given them, with its usage (argparse's top level would).
            getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            status = args.func(args)
        except (AdrqError, SQLAlchemyError, ValueError) as exc:
            print(f"airflow-adrq: error: {one_line(exc)}", file=sys.stderr)
            return EXIT_COULD_NOT_RUN
        return status
    except KeyboardInterrupt:
        print("airflow-adrq: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do
        # (and keep Python from complaining again while flushing at exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _external_commands() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP)}


def one_line(exc: BaseException) -> str:
    """An error as one line: the driver's own message for database errors, no SQL, no traceback."""
    if isinstance(exc, sa.exc.ArgumentError | sa.exc.NoSuchModuleError):
        return f"not a usable database URL: {first_line(exc)}"
    return first_line(exc)


def build_parser() -> argparse.ArgumentParser:
    """The ``airflow-adrq`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="airflow-adrq",
        description="Deadlock-free asset_dag_run_queue writes for Apache Airflow.",
        epilog=f"Other installed distributions may add commands (entry-point group {COMMANDS_GROUP}).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(func=lambda _args: _usage(parser))
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_db_parser(subparsers)
    doctor.add_doctor_parser(subparsers)
    for name, ep in sorted(_external_commands().items()):
        dist = ep.dist.name if ep.dist else "another distribution"
        help_text = f"see `airflow-adrq {name} --help` (from {dist})"
        subparsers.add_parser(name, allow_abbrev=False, help=help_text).set_defaults(func=lambda _args: 2)
    return parser


def add_db_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``db upgrade|downgrade|current|check``."""
    db = subparsers.add_parser(
        "db",
        allow_abbrev=False,
        help="create or upgrade airflow-adrq's own database (never Airflow's)",
        description="Alembic migrations for a database of airflow-adrq's own. "
        "Refuses a database that holds Airflow's schema.",
    )
    db.set_defaults(func=lambda _args: _usage(db), command_parser=db)
    commands = db.add_subparsers(title="db commands", metavar="DB_COMMAND", dest="db_command")
    url = os.environ.get(URL_ENV)
    for name, func, help_text, revision_help in (
        ("upgrade", _db_migrate, "upgrade to a revision (default: head)", "target revision (default: head)"),
        (
            "downgrade",
            _db_migrate,
            "downgrade to a revision ('base' drops all tables)",
            "target revision, or 'base' (required)",
        ),
        ("current", _db_current, "print the database's revision", None),
        ("check", _db_check, "exit 1 unless at head and identical to the models (4: could not check)", None),
    ):
        command = commands.add_parser(name, allow_abbrev=False, help=help_text)
        command.add_argument(
            "--url",
            type=doctor.database_url,
            default=url,
            required=url is None,
            help=f"SQLAlchemy database URL (default: ${URL_ENV})",
        )
        if revision_help is not None:
            # Positional, as Alembic users type it (`db downgrade base`); --revision kept.
            command.add_argument("revision", nargs="?", metavar="REVISION", help=revision_help)
            command.add_argument("--revision", dest="revision_option", help=argparse.SUPPRESS)
        command.set_defaults(func=func, command_parser=command)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _show(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)


def _db_migrate(args: argparse.Namespace) -> int:
    """``db upgrade`` (default revision: head) or ``db downgrade`` (a revision is required)."""
    given = [r for r in (args.revision, args.revision_option) if r is not None]
    parser: argparse.ArgumentParser = args.command_parser
    if len(given) == 2 and given[0] != given[1]:
        parser.error(f"two different revisions given: {given[0]!r} and --revision {given[1]!r}")
    upgrade = args.db_command == "upgrade"
    revision = given[0] if given else ("head" if upgrade else None)
    if revision is None:
        parser.error("a revision is required, e.g. `airflow-adrq db downgrade base`")
    result = (migrate.upgrade if upgrade else migrate.downgrade)(args.url, revision)
    print(f"database: {_show(args.url)}")
    if not result.steps:
        print(f"nothing to do: already at {result.after or '<base>'}")
        return 0
    for step in result.steps:
        verb = "applied" if step.direction == "upgrade" else "reverted"
        print(f"{verb} {step.revision}: {step.doc}")
    for verb, tables in (("created", result.tables_created), ("dropped", result.tables_dropped)):
        if tables:
            print(f"{verb} tables: {', '.join(tables)}")
    print(f"revision: {result.before or '<base>'} -> {result.after or '<base>'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
    print(migrate.current(args.url) or "<base>")
    return 0


def _db_check(args: argparse.Namespace) -> int:
    result = migrate.check(args.url)
    print(f"database: {_show(args.url)}")
    print(f"revision: {result.current or '<base>'} (head: {result.head})")
    for diff in result.diffs:
        print(f"differs from airflow_adrq.models: {migrate.describe_diff(diff)}")
    if result.ok:
        print("ok: at head and identical to airflow_adrq.models")
        return 0
    if result.current != result.head:
        print("not at head: run `airflow-adrq db upgrade`")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
