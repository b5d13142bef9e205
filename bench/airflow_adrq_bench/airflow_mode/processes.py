"""What imports Airflow, out of the controllers' process: this environment's ``airflow`` CLI, and a
:class:`Child` (a spawned ``ProcessPoolExecutor`` of one worker with the run's own Airflow settings,
none of the caller's) whose module-level functions the controller calls."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from airflow_adrq_bench.errors import BenchError

#: Every child is spawned: a fresh interpreter, nothing of the controller's state (or its Airflow settings).
SPAWN = multiprocessing.get_context("spawn")


def airflow(
    args: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start the ``airflow`` CLI installed next to this interpreter (``python -m airflow`` without one)
    with ``args`` and exactly ``env``, in a process group of its own, its output appended to ``log``."""
    script = Path(sys.executable).parent / "airflow"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "airflow"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [*command, *args],
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


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


def start_migrate(env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``airflow db migrate`` (the schema as an operator makes it); :func:`wait_migrate` waits."""
    return airflow(["db", "migrate"], env, log)


def wait_migrate(proc: subprocess.Popen[bytes], log: Path, timeout: float = 900, label: str = "") -> None:
    """Wait for ``proc``; on failure :class:`BenchError` (``label`` first) with the log's tail."""
    what = f"{label}airflow db migrate"
    try:
        proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BenchError(f"{what} did not finish within {timeout:.0f} s (log: {log})") from None
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"{what} failed (exit {proc.returncode}, log: {log}):\n{tail}")


class AirflowOrm:
    """Airflow's own ORM in a child, pointed at one scratch database at a time (``reconfigure_orm``:
    Airflow's engine arguments, event handlers and session maker, as its own processes get them)."""

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


def _start(settings: Mapping[str, str], setup: Callable[..., None], args: tuple[Any, ...]) -> None:
    # Ctrl-C reaches the whole process group: the controller stops its children, they ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    environ = clean_environ(settings)
    os.environ.clear()
    os.environ.update(environ)
    setup(*args)


class Child:
    """One spawned process that ran ``setup(*args)`` under ``settings``; :meth:`call` runs a function there.
    ``spawn_env``: set while it is spawned (a ``PYTHONHASHSEED`` must be there as its interpreter starts)."""

    def __init__(
        self,
        label: str,
        settings: Mapping[str, str],
        setup: Callable[..., None],
        *args: Any,
        spawn_env: Mapping[str, str] | None = None,
    ) -> None:
        self.label, self.pid = label, 0
        self.pool = cf.ProcessPoolExecutor(
            1, mp_context=SPAWN, initializer=_start, initargs=(settings, setup, args)
        )
        with mock.patch.dict(os.environ, spawn_env or {}):  # restored afterwards
            self._first = self.pool.submit(os.getpid)  # spawns the process now, with spawn_env
        self._pending = [self._first]

    def submit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """Start ``function(*args, **kwargs)`` in the child; :meth:`result` collects it."""
        future = self.pool.submit(function, *args, **kwargs)
        self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def result(self, future: cf.Future[Any], timeout: float = 600) -> Any:
        """``future``'s value; :class:`BenchError` if the call failed, the child died or stayed silent."""
        try:
            return future.result(timeout)
        except cf.TimeoutError:
            raise BenchError(f"{self.label} did not answer within {timeout:g} s") from None
        except cf.process.BrokenProcessPool:
            raise BenchError(f"{self.label} is gone; its output is above") from None
        except Exception as exc:
            raise BenchError(f"{self.label} failed: {exc!r}\n{exc.__cause__ or ''}") from None

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`submit`, then :meth:`result`."""
        return self.result(self.submit(function, *args, **kwargs))

    def started(self) -> int:
        """Wait until the child has imported what its set-up imports; its pid."""
        self.pid = self.result(self._first, 600.0)  # two dozen of them importing Airflow may share 2 cores
        return self.pid


def close_all(children: Iterable[Child], timeout: float = 30) -> None:
    """Stop ``children``: calls not started are cancelled; a child still busy after ``timeout`` is killed."""
    children = list(children)
    for child in children:
        child.pool.shutdown(wait=False, cancel_futures=True)
    cf.wait([f for child in children for f in child._pending], timeout)
    for child in children:
        if child.pid and any(not f.done() for f in child._pending):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        child.pool.shutdown(wait=True)
