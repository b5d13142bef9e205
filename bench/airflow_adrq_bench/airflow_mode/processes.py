"""The Airflow processes of the Airflow modes: the ``airflow`` CLI, and children driven over a pipe.

The controllers never import Airflow; what needs it runs in a child: the
``airflow`` command of this environment (``db migrate`` from
:func:`start_migrate` only), or a spawned process that imports Airflow once
and answers commands (:func:`serve`; the controller holds a :class:`Child`).
Every child gets the run's own Airflow settings, none of the caller's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_adrq_bench.errors import BenchError

__all__ = [
    "START_TIMEOUT",
    "AirflowOrm",
    "Child",
    "airflow_command",
    "airflow_settings",
    "apply_environment",
    "clean_environ",
    "serve",
    "spawn",
    "start_migrate",
    "wait_migrate",
]

#: Seconds a child gets to import Airflow and answer (two dozen of them may share 2 cores).
START_TIMEOUT = 600.0

#: What a child's ``setup`` returns: its start-up info, its commands, what ``close`` runs.
Setup = tuple[Any, dict[str, Callable[..., Any]], Callable[[], Any]]


def airflow_command() -> list[str]:
    """The ``airflow`` CLI installed next to this interpreter (``python -m airflow`` without one)."""
    script = Path(sys.executable).parent / "airflow"
    return [str(script)] if script.exists() else [sys.executable, "-m", "airflow"]


def airflow_settings(home: Path, url: str) -> dict[str, str]:
    """The Airflow settings of a run's processes: a private ``AIRFLOW_HOME``, no examples, ``url``."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
    }


def clean_environ(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without any Airflow setting, plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}, **settings}


def apply_environment(settings: Mapping[str, str]) -> None:
    """:func:`clean_environ` applied to this (child) process's own ``os.environ``."""
    for name in [n for n in os.environ if n.startswith("AIRFLOW")]:
        del os.environ[name]
    os.environ.update(settings)


def start_migrate(env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``airflow db migrate`` with exactly ``env``, in the background, its output to ``log``.

    Airflow's own schema, as an operator creates it; :func:`wait_migrate` waits for it.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            [*airflow_command(), "db", "migrate"],
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_migrate(proc: subprocess.Popen[bytes], log: Path, timeout: float = 900) -> None:
    """Wait for :func:`start_migrate`'s ``proc``; raise :class:`BenchError` with the log's tail on failure."""
    try:
        proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BenchError(f"airflow db migrate did not finish within {timeout:.0f} s (log: {log})") from None
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"airflow db migrate failed (exit {proc.returncode}, log: {log}):\n{tail}")


class AirflowOrm:
    """Airflow's own ORM in a child, pointed at one scratch database at a time.

    ``airflow.settings.reconfigure_orm``: Airflow's engine arguments, event
    handlers and session maker, exactly as its own processes get them.
    """

    engine: Any = None
    session_factory: Any = None

    def point_at(self, url: str) -> Any:
        """Point Airflow's ORM at ``url``; returns Airflow's engine."""
        from airflow import settings

        self.release()
        os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url
        settings.configure_vars()
        settings.reconfigure_orm()
        assert settings.engine is not None, "settings.reconfigure_orm() made no engine"
        self.engine, self.session_factory = settings.engine, settings.NonScopedSession
        return self.engine

    def release(self) -> None:
        """Dispose of Airflow's engine (before the scratch database is dropped)."""
        if self.engine is not None:
            from airflow import settings

            settings.dispose_orm(do_log=False)
            self.engine = self.session_factory = None


def serve(conn: Any, settings: Mapping[str, str], setup: Callable[[], Setup]) -> None:
    """A child's life: take ``settings``, run ``setup`` (it imports Airflow), then answer commands.

    Sends ``("ok", info)`` (or the set-up's traceback) first; ``close`` (or the
    controller's end of the pipe closing) ends the loop. Ctrl-C reaches the
    whole process group: the controller stops its children, they ignore it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    apply_environment(settings)
    try:
        info, commands, close = setup()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", info))
    while True:
        try:
            name, kwargs = conn.recv()
        except EOFError:
            break
        if name == "close":
            close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", commands[name](**kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


@dataclass
class Child:
    """The controller's end of one child's command pipe; ``process`` is what must stay alive for it."""

    label: str
    conn: Any
    process: Any
    info: dict[str, Any] = field(default_factory=dict)

    def send(self, name: str, **kwargs: Any) -> None:
        self.conn.send((name, kwargs))

    def receive(self, timeout: float = 600) -> Any:
        """The next answer; raises :class:`BenchError` if the child failed, died or stayed silent."""
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise BenchError(f"{self.label} is gone; its output is above")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.label} did not answer within {timeout:g} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise BenchError(f"{self.label} exited; its output is above") from None
        if status != "ok":
            raise BenchError(f"{self.label} failed:\n{value}")
        return value

    def call(self, name: str, timeout: float = 600, **kwargs: Any) -> Any:
        self.send(name, **kwargs)
        return self.receive(timeout)

    def closed_by(self, deadline: float) -> bool:
        """After ``close`` was sent: whether the child answered by ``deadline``; the pipe is closed."""
        answered = False
        with contextlib.suppress(Exception):
            answered = bool(self.conn.poll(max(0.1, deadline - time.monotonic())))
        with contextlib.suppress(Exception):
            self.conn.close()
        return answered

    def stop(self) -> None:
        """Ask it to exit, give it 30 s, then end its process (a spawned child of its own: :func:`spawn`)."""
        with contextlib.suppress(Exception):
            self.send("close")
        deadline = time.monotonic() + 30
        self.closed_by(deadline)
        end(self.process, deadline)


def spawn(label: str, target: Callable[..., None], *args: Any) -> Child:
    """Start ``target(conn, *args)`` in a spawned process; the controller's :class:`Child` of it."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), name=label)
    process.start()
    child.close()
    return Child(label, parent, process)


def end(process: Any, deadline: float) -> None:
    """Join ``process`` until ``deadline``, then terminate it."""
    process.join(timeout=max(0.1, deadline - time.monotonic()))
    if process.is_alive():
        process.terminate()
        process.join(timeout=5)
