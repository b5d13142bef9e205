"""The api-server's resident memory during the bursts: its process tree, sampled from the controller.

apache/airflow#66853 reports api-servers killed for memory when 80+ task-success calls arrive at
once while ``register_asset_change`` runs under the task instance's row lock: the calls queue up
inside the api-server. What that costs is the resident memory of the whole api-server (whatever
holds it: threads, queued requests, connections), so the figure is the sum over its
process tree: the ``airflow api-server`` process and its descendants (uvicorn's worker processes
with ``[api] workers`` > 1). Every :data:`PERIOD_S` a thread reads each process's RSS and thread
count (``/proc/<pid>/statm`` and ``status``, through psutil) and adds them up; the peak of that sum
is what a cgroup's memory limit would have met, to one period. On leaving, each process's ``VmHWM``
(``/proc/<pid>/status``: the kernel's own peak of its RSS, since it started, between samples too)
is read as well: their sum bounds the peak of the sum from above. At every walk of the tree (each
:data:`TREE_EVERY` samples) it also counts the tree's TCP connections to the database's port: the
connections its pools hold (PgBouncer's port with ``--pgbouncer``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import psutil

from airflow_adrq_bench.airflow_mode.config import LiveError
from airflow_adrq_bench.stats import percentile

#: Seconds between two samples.
PERIOD_S: Final = 0.1
#: Samples between two walks of the process tree (a walk reads every process's parent on the machine:
#: at a burst that is hundreds of task processes; the api-server's own tree changes only as uvicorn
#: replaces a worker).
TREE_EVERY: Final = 10
_MB: Final = 1024 * 1024


@dataclass
class Process:
    """One process of the tree as the samples saw it: its command line (abridged), its largest sampled
    RSS and thread count, and its ``VmHWM`` read on leaving (None: it had exited)."""

    command: str
    peak_rss: int = 0
    peak_threads: int = 0
    hwm: int | None = None


@dataclass
class Samples:
    """What the samples saw: per sample its time (monotonic s), the tree's RSS sum (bytes) and thread
    sum; the processes by pid; the sample index each :meth:`Sampler.mark` began at; the database
    connections counted at each walk of the tree."""

    taken: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    processes: dict[int, Process] = field(default_factory=dict)
    marks: list[tuple[str, int]] = field(default_factory=list)

    def add(self, taken: float, readings: Sequence[tuple[int, int, int]]) -> None:
        """One sample: ``(pid, rss, threads)`` of every process of the tree still alive."""
        self.taken.append(taken)
        self.rss.append(sum(rss for _, rss, _ in readings))
        self.threads.append(sum(n for _, _, n in readings))
        for pid, rss, n in readings:
            seen = self.processes[pid]
            seen.peak_rss, seen.peak_threads = max(seen.peak_rss, rss), max(seen.peak_threads, n)


def vm_hwm(pid: int) -> int | None:
    """Process ``pid``'s ``VmHWM`` in bytes (None: gone, or no such line: not Linux)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # in kB
    return None


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value / _MB, 1)


def summarize(samples: Samples, root: int) -> dict[str, Any]:
    """The sums' first value (before the bursts) and peak (MB; when, in s from the first sample), the
    peak per mark, the thread sums' first and largest value, and each process's figures (MB)."""
    gaps = [b - a for a, b in zip(samples.taken, samples.taken[1:], strict=False)]
    out: dict[str, Any] = {
        "root_pid": root,
        "samples": len(samples.rss),
        "interval_ms": {"p50": _ms(percentile(gaps, 50)), "max": _ms(percentile(gaps, 100))},
        "before_mb": None,
        "peak_mb": None,
        "peak_at_s": None,
        "threads_before": None,
        "threads_max": None,
        "db_connections_before": None,
        "db_connections_max": None,
    }
    if samples.rss:
        peak = max(range(len(samples.rss)), key=samples.rss.__getitem__)
        out |= {
            "before_mb": _mb(samples.rss[0]),
            "peak_mb": _mb(samples.rss[peak]),
            "peak_at_s": round(samples.taken[peak] - samples.taken[0], 1),
            "threads_before": samples.threads[0],
            "threads_max": max(samples.threads),
        }
    if samples.connections:
        out |= {
            "db_connections_before": samples.connections[0],
            "db_connections_max": max(samples.connections),
        }
    # Each mark's samples run to the next mark's first (the last mark's, to the last sample).
    ends = [index for _, index in samples.marks[1:]] + [len(samples.rss)]
    out["per_mark"] = {
        label: _mb(max(samples.rss[start:end], default=None))
        for (label, start), end in zip(samples.marks, ends, strict=False)
    }
    hwms = [p.hwm for p in samples.processes.values()]
    out["hwm_sum_mb"] = (
        _mb(sum(h for h in hwms if h is not None)) if any(h is not None for h in hwms) else None
    )
    out["processes"] = [
        {
            "pid": pid,
            "command": p.command,
            "peak_rss_mb": _mb(p.peak_rss),
            "hwm_mb": _mb(p.hwm),
            "peak_threads": p.peak_threads,
        }
        for pid, p in sorted(samples.processes.items(), key=lambda kv: kv[0] != root)
    ]
    return out


def _ms(seconds: float) -> float | None:
    return None if seconds != seconds else round(seconds * 1000, 1)  # NaN (under two samples): None


class Sampler:
    """Samples the process tree of ``pid`` every :data:`PERIOD_S` in a thread while entered (reading the
    ``VmHWM`` of each of its processes on leaving), counting its connections to ``db_port`` at each walk
    (with one); :attr:`error` is what stopped it early, if anything.
    """

    def __init__(self, pid: int, db_port: int | None = None) -> None:
        self.pid, self.db_port, self.samples = pid, db_port, Samples()
        self.error: str | None = None
        self._tree: list[psutil.Process] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adrq-live-memory-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        try:  # the api-server must be there now: a wrong pid is an error here, not an empty sample
            self._walk()
        except psutil.Error as exc:
            raise LiveError(f"the api-server's memory: {type(exc).__name__}: {exc}") from None
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        for pid, seen in self.samples.processes.items():
            seen.hwm = vm_hwm(pid)

    def mark(self, label: str) -> None:
        """From the next sample on, samples belong to ``label`` (a burst) in the summary's ``per_mark``."""
        self.samples.marks.append((label, len(self.samples.rss)))

    def _walk(self) -> None:
        """The tree of :attr:`pid` now (psutil raises NoSuchProcess when the root is gone)."""
        root = psutil.Process(self.pid)
        self._tree = [root, *root.children(recursive=True)]
        connections = 0
        for process in self._tree:
            with contextlib.suppress(psutil.Error):  # one that exited meanwhile
                if process.pid not in self.samples.processes:
                    command = " ".join(process.cmdline())[:120]
                    self.samples.processes[process.pid] = Process(command)
                if self.db_port is not None:
                    sockets = process.net_connections(kind="tcp")
                    connections += sum(1 for c in sockets if c.raddr and c.raddr.port == self.db_port)
        if self.db_port is not None:
            self.samples.connections.append(connections)

    def _read(self) -> list[tuple[int, int, int]]:
        readings = []
        for process in self._tree:
            with contextlib.suppress(psutil.Error):  # a worker that exited since the last walk
                if process.pid in self.samples.processes:
                    readings.append((process.pid, process.memory_info().rss, process.num_threads()))
        return readings

    def _run(self) -> None:
        try:
            count = 0
            while True:
                due = time.monotonic() + PERIOD_S
                if count and count % TREE_EVERY == 0:
                    self._walk()
                self.samples.add(time.monotonic(), self._read())
                count += 1
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
        except psutil.Error as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def summary(self) -> dict[str, Any]:
        """:func:`summarize` of what was sampled, with the error that stopped the sampler (None)."""
        return {**summarize(self.samples, self.pid), "error": self.error}
