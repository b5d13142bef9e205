"""Command-line pieces every ``airflow-adrq bench`` mode shares.

Each mode's sizes are a frozen dataclass; its command line has one option per
field (``--round-timeout-s`` for ``round_timeout_s``), typed from the field's
annotation, and the sizes it runs with are a preset (``--quick`` or the
defaults) with the options given replacing their fields. The modes differ
only in their help texts. The ``--db`` / ``--backend`` pair says where to run.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "add_routing_flags",
    "add_server_options",
    "add_size_options",
    "check_server_options",
    "float_list",
    "given_sizes",
    "int_list",
    "show",
    "sizes_from",
]

_SizesT = TypeVar("_SizesT", bound="DataclassInstance")


def int_list(text: str) -> tuple[int, ...]:
    """``1,16,256`` -> ``(1, 16, 256)``."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None


def float_list(text: str) -> tuple[float, ...]:
    """``5,30`` -> ``(5.0, 30.0)``."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, not {text!r}") from None


#: The option type of each field annotation the sizes dataclasses use.
_KINDS: Mapping[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "tuple[int, ...]": int_list,
    "tuple[float, ...]": float_list,
}


def show(value: object) -> str:
    """A size as the help texts show it: ``5``, ``0.5``, ``1,16,256``."""
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_size_options(
    group: argparse._ActionsContainer,
    sizes: type[DataclassInstance],
    describe: Callable[[str], str],
    *,
    kinds: Mapping[str, Callable[[str], Any]] | None = None,
    metavar: Callable[[str, str], str] | None = None,
) -> None:
    """One option per field of ``sizes``; ``describe(field name)`` is its help text.

    ``kinds`` replaces the option type of an annotation (a parser that also
    checks the values); ``metavar(field name, annotation)`` names its value.
    Every option defaults to ``None``: :func:`given_sizes` tells what was given.
    """
    types = {**_KINDS, **(kinds or {})}
    for field in dataclasses.fields(sizes):
        extra: dict[str, Any] = {} if metavar is None else {"metavar": metavar(field.name, str(field.type))}
        group.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=types[str(field.type)],
            default=None,
            dest=field.name,
            help=describe(field.name),
            **extra,
        )


def given_sizes(args: argparse.Namespace, sizes: type[DataclassInstance]) -> dict[str, Any]:
    """The size options given on the command line: ``{field name: value}``."""
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(sizes)
        if getattr(args, f.name, None) is not None
    }


def sizes_from(args: argparse.Namespace, base: _SizesT) -> _SizesT:
    """``base`` with the size options given; raises ``ValueError`` where the sizes refuse a value."""
    return dataclasses.replace(base, **given_sizes(args, type(base)))


def add_routing_flags(parser: argparse.ArgumentParser, *flags: str) -> None:
    """Accept, and hide, the flags that routed the command line to this mode (they are passed on)."""
    for flag in flags:
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)


def add_server_options(
    parser: argparse.ArgumentParser,
    *,
    db_help: str,
    backends: Sequence[str] | None = None,
    backend_help: str = "without --db: only these (repeatable)",
) -> None:
    """``--db URL`` (repeatable) and, with ``backends``, ``--backend`` to choose among the servers found."""
    parser.add_argument("--db", action="append", metavar="URL", help=db_help)
    if backends is not None:
        parser.add_argument("--backend", action="append", choices=backends, help=backend_help)


def check_server_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error when both ``--db`` and ``--backend`` are given."""
    if args.db and args.backend:
        parser.error("--backend selects among the servers found without --db; give one or the other")
