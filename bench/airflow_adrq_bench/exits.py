"""The exit status of every ``airflow-adrq bench`` mode: one meaning per code, so a script can branch on it.

A finished run is judged by :func:`judge` (its failed checks, and with ``--check`` its verdict); a run that
could not finish gets :attr:`Exit.COULD_NOT_RUN` from :func:`.options.guarded`, a bad command line
argparse's 2. :data:`EPILOG` is the table ``--help`` ends with.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # at run time: no cycle through config, which imports options, which imports this
    from airflow_adrq_bench.verdict import Line


class Exit(enum.IntEnum):
    """What the exit status says."""

    #: The run finished and its answer is good: every check passed (``--check``: every target met).
    OK = 0
    #: The run finished and its answer is bad: a check failed, or (``--check``) a target was MISSED.
    MISSED = 1
    #: argparse's own code for a bad command line; never returned, argparse exits with it.
    USAGE = 2
    #: ``--check``: no target missed, but some ``unclear`` (within the noise), not allowed.
    UNCLEAR = 3
    #: Nothing was judged: no server, no driver, a database refused or unreachable, a process failed.
    COULD_NOT_RUN = 4
    #: Ctrl-C (``--live``: SIGTERM too): every process stopped, scratch databases dropped.
    INTERRUPTED = 130


#: The table at the end of ``--help`` (kept as written: the help formatter leaves indented text alone).
EPILOG = """\
exit status (every mode of airflow-adrq bench):
  0    finished, and the answer is good: every check passed (with --check:
       every target of the verdict met)
  1    finished, and the answer is bad: a check failed (queue rows not exact,
       counts that do not add up, ...) or, with --check, a target was MISSED
  2    usage error: a bad option or value (nothing ran)
  3    with --check: no target missed, but some unclear (within the noise);
       --allow-unclear makes this 0
  4    could not run: no server, no driver, a database refused or unreachable,
       a benchmark process failed (nothing was judged)
  130  interrupted (Ctrl-C; --live: SIGTERM too): processes stopped, scratch
       databases dropped"""

CHECK_HELP = "judge the verdict: exit 1 when a target is MISSED, 3 when one is unclear (see below)"
ALLOW_UNCLEAR_HELP = "with --check: unclear targets do not fail the run (exit 0 instead of 3)"


@dataclass(frozen=True)
class Outcome:
    """A finished run's exit status and why: one message per failed check, missed or unclear target."""

    status: Exit
    reasons: list[str] = field(default_factory=list)


def judge(
    problems: Sequence[str],
    lines: Sequence[Line] = (),
    *,
    check: bool = False,
    allow_unclear: bool = False,
) -> Outcome:
    """The outcome of a run with these failed checks (``problems``) and verdict ``lines``: a failed check
    or (``check``) a MISSED line is :attr:`Exit.MISSED`; else (``check``, not ``allow_unclear``) an
    ``unclear`` line is :attr:`Exit.UNCLEAR`; else :attr:`Exit.OK`."""
    reasons = list(problems)
    if check:
        reasons += [
            f"target missed: {ln.db} {ln.what}: {ln.measured} (target {ln.goal})"
            for ln in lines
            if ln.verdict == "MISSED"
        ]
    if reasons:
        return Outcome(Exit.MISSED, reasons)
    unclear = [ln for ln in lines if ln.verdict == "unclear"]
    if check and unclear and not allow_unclear:
        said = "target unclear: {}: {} (target {}; --allow-unclear accepts it)"
        return Outcome(
            Exit.UNCLEAR, [said.format(f"{ln.db} {ln.what}", ln.measured, ln.goal) for ln in unclear]
        )
    return Outcome(Exit.OK)
