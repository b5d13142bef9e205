"""Progress of long work on ``rich``, on stderr: what is running, how far, how long is left.

Where rich draws nothing live (CI logs, a pipe), :meth:`Task.step` prints a plain line at most every 15 s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich import progress as rich
from rich.console import Console

#: stderr: progress and diagnosis never mix with the tables on stdout.
console = Console(stderr=True, highlight=False)
_PLAIN_EVERY_S = 15.0


class Task:
    """One piece of long work: ``total`` steps, each with a note of what runs."""

    def __init__(self, progress: rich.Progress, label: str, total: float) -> None:
        self._progress = progress
        self._id = progress.add_task(label, total=total, note="")
        self._printed = -_PLAIN_EVERY_S

    def step(self, note: str, advance: float = 0) -> None:
        """Say what runs now (``note``) and count ``advance`` steps as done."""
        self._progress.update(self._id, advance=advance, note=note)
        now = time.monotonic()
        if not console.is_terminal and now - self._printed >= _PLAIN_EVERY_S:
            self._printed, t = now, self._progress.tasks[self._id]
            console.print(f"{t.description} [{t.completed:g}/{t.total:g}, {t.elapsed or 0:.0f} s]: {note}")

    def say(self, message: str) -> None:
        """A line that stays (a milestone, a warning), printed above the bar."""
        self._progress.console.print(message)


@contextlib.contextmanager
def task(label: str, total: float) -> Iterator[Task]:
    """Show progress of ``label`` while the block runs; the bar stays, complete, when it ends."""
    bar = [rich.TextColumn("[bold]{task.description}"), rich.BarColumn(), rich.MofNCompleteColumn()]
    times = [rich.TimeElapsedColumn(), rich.TextColumn("left"), rich.TimeRemainingColumn()]
    with rich.Progress(*bar, *times, rich.TextColumn("{task.fields[note]}"), console=console) as progress:
        yield Task(progress, label, total)
