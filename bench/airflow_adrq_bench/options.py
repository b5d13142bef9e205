"""What every ``airflow-adrq bench`` mode's command line shares: the modes differ only in what they run.

A mode's sizes are a frozen :class:`Checked` dataclass of :func:`size` fields (:func:`count` and the
like: with their bound); :func:`add_common` and :func:`add_fields` make its options, :func:`sizes_from`
its sizes; :func:`guarded` and :func:`publish` are what every mode does around its measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import importlib.metadata
import operator
import sys
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from airflow_adrq.errors import AdrqError
from airflow_adrq_bench import tables
from airflow_adrq_bench.exits import Exit, Outcome

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


_T = TypeVar("_T")
_SizesT = TypeVar("_SizesT", bound="DataclassInstance")


def size(
    default: _T, text: str = "", minimum: float | None = None, *, above: float | None = None, **metadata: Any
) -> _T:
    """A sizes field: its default, its ``--help`` text, the bound every value must meet (at least
    ``minimum`` or greater than ``above``) and any ``choices``, the only values its option takes."""
    metadata |= {"help": text, "minimum": minimum, "above": above}
    return dataclasses.field(default=default, metadata=metadata)


#: :func:`size` with its bound: at least 1, at least 0, above 0 (every value, for a tuple).
count = functools.partial(size, minimum=1)
nonnegative = functools.partial(size, minimum=0)
positive = functools.partial(size, above=0)


def _check(field: dataclasses.Field[Any], value: Any, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` when ``value`` (each value, for a tuple) misses ``field``'s bound."""
    values = value if isinstance(value, tuple) else (value,)
    for key, word, meets in (("minimum", "at least", operator.ge), ("above", "above", operator.gt)):
        bound = field.metadata.get(key)
        if bound is not None and not (values and all(meets(v, bound) for v in values)):
            raise error(f"{field.name} must be {word} {bound:g}, not {show(value) or 'nothing'}")


class Checked:
    """A sizes dataclass that refuses (``ValueError``) a field value missing its :func:`size` bound."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(cast("DataclassInstance", self)):
            _check(field, getattr(self, field.name))


def show(value: object) -> str:
    """A size as the help texts show it: ``5``, ``0.5``, ``1,16,256``."""
    if isinstance(value, tuple):
        return ",".join(map(show, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, except that a text with indented lines (the exit-status table) stays as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if any(line.startswith(" ") for line in text.splitlines()):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_fields(
    group: argparse._ActionsContainer,
    default: DataclassInstance,
    preset: DataclassInstance | None = None,
    flag: str = "--quick",
) -> None:
    """One option per field of ``default``'s dataclass: its help text, then its default and ``flag``'s
    (``preset``'s; a ``bool`` field is a flag, with neither). Every option defaults to ``None``
    (:func:`given` tells what was given); argparse parses it and checks its bound (:func:`_parse`)."""
    hints = typing.get_type_hints(type(default))
    for field in dataclasses.fields(default):
        value, hint, name = getattr(default, field.name), hints[field.name], field.name
        shown = [] if value is None or isinstance(value, bool) else [f"default {show(value)}"]
        if preset is not None and not isinstance(value, bool):
            shown.append(f"{flag} {show(getattr(preset, name))}")
        text = " ".join([field.metadata.get("help", ""), f"({'; '.join(shown)})" if shown else ""]).strip()
        how: dict[str, Any] = {"action": "store_true", "default": None}
        if hint is not bool:
            many = typing.get_origin(hint) is tuple
            kind = next(a for a in (*typing.get_args(hint), hint) if a not in (type(None), Ellipsis))
            metavar = {"s": "S", "ms": "MS"}.get(name.rpartition("_")[2], "N" if hint is int else "X")
            choices = field.metadata.get("choices")
            how = {"choices": choices} if choices else {"metavar": "N,N,..." if many else metavar}
            how["type"] = functools.partial(_parse, field, kind, many)
        group.add_argument(f"--{name.replace('_', '-')}", dest=name, help=text, **how)


def _parse(field: dataclasses.Field[Any], kind: Callable[[str], Any], many: bool, text: str) -> Any:
    """``text`` parsed (comma-separated values if ``many``) and checked against ``field``'s bound."""
    try:
        value = tuple(kind(x) for x in text.split(",") if x.strip()) if many else kind(text)
    except ValueError:
        what = "comma-separated numbers" if many else "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}") from None
    _check(field, value, argparse.ArgumentTypeError)
    return value


def given(args: argparse.Namespace, sizes: type[DataclassInstance]) -> dict[str, Any]:
    """The options of ``sizes``'s fields given on the command line: ``{field name: value}``."""
    return {f.name: v for f in dataclasses.fields(sizes) if (v := getattr(args, f.name, None)) is not None}


def sizes_from(parser: argparse.ArgumentParser, args: argparse.Namespace, base: _SizesT) -> _SizesT:
    """``base`` with the size options given; a usage error where the sizes refuse a value."""
    try:
        return dataclasses.replace(base, **given(args, type(base)))
    except ValueError as exc:
        parser.error(str(exc))


def add_common(
    parser: argparse.ArgumentParser,
    *,
    db_help: str,
    preset: tuple[str, str],
    out: str,
    routing: Sequence[str] = (),
    backends: Sequence[str] | None = None,
) -> None:
    """``--db URL`` (repeatable), ``--backend`` among ``backends``, the ``preset`` flag (name, help),
    ``--out`` (default ``bench-results/<out><UTC timestamp>``) and, hidden, the ``routing`` flags that
    routed the command line to this mode."""
    for flag in routing:
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", action="append", metavar="URL", type=_database_url, help=db_help)
    if backends is not None:
        only = "without --db: only these (repeatable)"
        parser.add_argument("--backend", action="append", choices=backends, help=only)
    parser.add_argument(preset[0], dest="preset", action="store_true", help=preset[1])
    where = f"output directory (default: ./bench-results/{out}<UTC time>)"
    parser.add_argument("--out", type=Path, help=where)
    parser.set_defaults(out_prefix=out)


def _database_url(text: str) -> str:
    """``--db``'s type: a database URL (which backend it names is each mode's to check)."""
    try:
        make_url(text)
    except ArgumentError:
        raise argparse.ArgumentTypeError(f"not a SQLAlchemy database URL: {text!r}") from None
    return text


def out_dir(args: argparse.Namespace) -> Path:
    """``--out``, or ``bench-results/<the mode's prefix><UTC timestamp>``."""
    stamp = f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
    return cast(Path, args.out or Path("bench-results") / f"{args.out_prefix}{stamp}")


def servers_found(stack: contextlib.ExitStack, backends: Sequence[str] | None = None) -> list[str]:
    """The URLs of the servers of ``backends`` (default: all) that :func:`servers.discover` finds or
    starts (stopped when ``stack`` closes); says each, and each backend without one."""
    from airflow_adrq_testing import servers  # here: the workers import this module for the sizes

    urls = []
    for backend in [b for b in servers.BACKENDS if not backends or b in backends]:
        try:
            info = stack.enter_context(servers.discover(backend))
        except servers.ServerNotFoundError as exc:
            say(f"not measuring {backend}: {exc}")
            continue
        say(f"{info.version}: {info.how_found}")
        urls.append(info.url)
    return urls


def say(message: str) -> None:
    """A line of progress or diagnosis on stderr (the tables go to stdout), wrapped to
    :data:`.tables.WIDTH` columns."""
    print(tables.wrap(message), file=sys.stderr, flush=True)


def guarded(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    measure: Callable[[], int],
    *,
    airflow: str = "",
    prog: str = "",
) -> int:
    """``measure()``'s exit status; :attr:`Exit.COULD_NOT_RUN` with one line when it cannot run (an
    error of the benchmark, the database or its driver; a traceback too for anything else), 130 on
    Ctrl-C. Before it: a usage error for ``--db`` with ``--backend``; no Airflow when the mode needs it
    (``airflow``) is :attr:`Exit.COULD_NOT_RUN` too."""
    from airflow_adrq.cli import one_line  # here: the workers import this module for the sizes

    prog = prog or parser.prog
    if getattr(args, "backend", None) and args.db:
        parser.error("--backend selects among the servers found without --db; give one or the other")
    # The distribution, not `import airflow`: a directory named airflow on sys.path would pass for it.
    if airflow and not any(importlib.metadata.distributions(name="apache-airflow-core")):
        say(f"{prog}: error: needs {airflow} in this environment (from a checkout: tox -e airflow-bench)")
        return Exit.COULD_NOT_RUN
    try:
        return measure()
    except (AdrqError, SQLAlchemyError, ImportError) as exc:
        # ImportError: a --db URL's driver is not installed (SQLAlchemy imports it when connecting).
        say(f"{prog}: error: {one_line(exc)}")
        return Exit.COULD_NOT_RUN
    except KeyboardInterrupt:
        say(f"{prog}: interrupted (every process stopped, scratch databases dropped)")
        return Exit.INTERRUPTED
    except Exception as exc:
        # A bug, not a verdict: exit 1 must only ever mean a finished run with a bad answer.
        traceback.print_exc()
        say(f"{prog}: error: could not run: {type(exc).__name__}: {exc}")
        return Exit.COULD_NOT_RUN


def publish(
    markdown: Path,
    text: str,
    written: Sequence[Path],
    outcome: Outcome,
    *,
    took: float | None = None,
    shown: str | None = None,
) -> int:
    """Write ``text`` (wrapped to :data:`.tables.WIDTH`) to ``markdown`` and print it (or only ``shown``:
    the rest is in the file), name the files, say why the run failed; ``outcome``'s exit status."""
    text = tables.wrap(text)
    markdown.write_text(text)
    print(text if shown is None else tables.wrap(shown))
    files = [*written[:1], markdown, *written[1:]]
    where = markdown.parent
    names = ", ".join(str(p.relative_to(where)) if p.parent == where else str(p) for p in files)
    print(tables.wrap(("" if took is None else f"took {took:.0f} s; ") + f"wrote to {where}/: {names}"))
    for reason in outcome.reasons:
        say(f"ERROR: {reason}")
    return int(outcome.status)
