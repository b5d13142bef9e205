"""What every Airflow mode's results share: the raw fields they open and close with, the detail's
heading, and the end of a run (the verdict printed; JSON and Markdown written)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_adrq_bench import options, tables
from airflow_adrq_bench.verdict import Line, format_verdict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def raw_opening(tool: str, sizes: DataclassInstance, managers: Sequence[str]) -> dict[str, Any]:
    """The first fields of a raw result: the tool, the start time, CPUs, load, sizes, managers."""
    return {
        "tool": tool,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        # Other work on the machine skews every number: the 1/5/15-minute load at start and end.
        "load_average": {"start": list(os.getloadavg())},
        "sizes": dataclasses.asdict(sizes),
        "managers": list(managers),
    }


def raw_finish(raw: dict[str, Any], started: float) -> None:
    """Add the run's duration since ``started`` (``time.monotonic()``) and the load at its end."""
    raw["duration_s"] = round(time.monotonic() - started, 1)
    raw["load_average"]["end"] = list(os.getloadavg())


def heading(title: str, raw: dict[str, Any]) -> str:
    """The detail's first line: what ran, on which Airflow, CPUs and 1-minute load (start, end)."""
    loads = ", ".join(f"{k} {v[0]:.1f}" for k, v in raw["load_average"].items())
    return f"## {title}: Apache Airflow {raw.get('airflow_version', '?')}, {raw['cpus']} CPUs (load {loads})"


def conclude(stem: Path, raw: dict[str, Any], detail: str, lines: Sequence[Line], problems: list[str]) -> int:
    """Write ``raw`` with the verdict ``lines`` and ``problems`` as ``stem.json`` and ``detail`` with the
    verdict as ``stem.md``; print the verdict, the files and each problem; 1 if there is a problem."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    raw |= {"verdict": [dataclasses.asdict(line) for line in lines], "problems": problems}
    tables.write_json(stem.with_suffix(".json"), raw)
    shown, md = format_verdict(lines), stem.with_suffix(".md")
    written = [stem.with_suffix(".json")]
    return options.publish(md, f"{detail}\n{shown}", written, problems, took=raw["duration_s"], shown=shown)
