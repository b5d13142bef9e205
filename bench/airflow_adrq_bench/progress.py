"""Progress of long work on ``rich``, on stderr: what is running, how far, how long is left.

Where rich draws nothing live (CI logs, a pipe), :meth:`Task.step` prints a plain line at most
every 15 s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Task", "console", "task"]

#: stderr: progress and diagnosis never mix with the tables on stdout.
console = Console(stderr=True, highlight=False)
_PLAIN_EVERY_S = 15.0


class Task:
    """One piece of long work: ``total`` steps (``None``: unknown), each with a note of what runs."""

    def __init__(self, progress: Progress, label: str, total: float | None) -> None:
        self._progress, self._label = progress, label
        self._id = progress.add_task(label, total=total, note="")
        self._printed = -_PLAIN_EVERY_S

    def step(self, note: str, advance: float = 0) -> None:
        """Say what runs now (``note``) and count ``advance`` steps as done."""
        self._progress.update(self._id, advance=advance, note=note)
        now = time.monotonic()
        if not console.is_terminal and now - self._printed >= _PLAIN_EVERY_S:
            self._printed = now
            done = self._progress.tasks[self._id]
            total = f"/{done.total:g}" if done.total is not None else ""
            console.print(f"{self._label} [{done.completed:g}{total}, {done.elapsed or 0:.0f} s]: {note}")

    def say(self, message: str) -> None:
        """A line that stays (a milestone, a warning), printed above the bar."""
        self._progress.console.print(message)


@contextlib.contextmanager
def task(label: str, total: float | None = None) -> Iterator[Task]:
    """Show progress of ``label`` while the block runs; the bar stays, complete, when it ends."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        yield Task(progress, label, total)
