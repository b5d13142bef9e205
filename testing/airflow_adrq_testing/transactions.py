"""One producer transaction, retried as a whole: what the concurrency tests and ``airflow-adrq bench`` run.

A producer transaction is what task success does: the strategy's whole
``register_asset_change`` per emitted asset (:mod:`.strategies`), a hold
before COMMIT, COMMIT; retried from BEGIN on a retryable failure by
:func:`airflow_adrq.run_in_transaction`. :class:`TxResult` says how it went.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import airflow_adrq
from airflow_adrq.errorcodes import Retryable
from airflow_adrq_testing.recording import counting

__all__ = ["TxResult", "emitted_assets", "process_rng", "run_transaction"]

#: ``outcome`` of a producer transaction record: every planned transaction gets exactly one.
COMMITTED: Final = "committed"
GAVE_UP: Final = "gave up"
NOT_STARTED: Final = "not started"
#: Why :func:`run_transaction` gave up (``TxResult.gave_up``).
GAVE_UP_ATTEMPTS: Final = "max attempts"
GAVE_UP_TIMEOUT: Final = "round timeout"
GAVE_UP_STOPPED: Final = "stopped"

_A = TypeVar("_A")


def process_rng() -> random.Random:
    """A generator seeded from ``os.urandom`` (not ``PYTHONHASHSEED``, which xdist may pin): every
    process its own order, as a ``set`` of freshly loaded ``DagModel`` objects (:mod:`.baselines`)."""
    return random.Random(int.from_bytes(os.urandom(8), "big"))


def emitted_assets(scenario: str, assets: Sequence[_A], rng: random.Random) -> list[_A]:
    """The assets one transaction emits: the first (``single``, ``lost_events``), or all in random order."""
    if scenario in ("single", "lost_events"):
        return [assets[0]]
    emitted = list(assets)
    rng.shuffle(emitted)
    return emitted


@dataclass
class TxResult:
    """One producer transaction, over all its attempts."""

    ok: bool
    attempts: int
    latency_s: float
    #: Statements sent by the attempt that committed (0 if none did).
    statements: int
    assets: list[int]
    failures: dict[str, int] = field(default_factory=dict)
    #: Not committed: why it stopped retrying (:data:`GAVE_UP_ATTEMPTS`,
    #: :data:`GAVE_UP_TIMEOUT` or :data:`GAVE_UP_STOPPED`); ``None`` if it committed.
    gave_up: str | None = None
    #: The failure kind of the last failed attempt (``None`` if none failed).
    last_failure: str | None = None

    @property
    def outcome(self) -> str:
        return COMMITTED if self.ok else GAVE_UP


def run_transaction(
    engine: Engine,
    work: Callable[[Session], None],
    *,
    max_attempts: int,
    deadline: float,
    hold_s: float,
    assets: Sequence[int] = (),
    give_up: Callable[[], bool] = lambda: False,
) -> TxResult:
    """Run ``work`` + hold + COMMIT under :func:`airflow_adrq.run_in_transaction` (retried from BEGIN on
    retryable failures, others propagate) until ``max_attempts``, ``deadline`` (``time.monotonic()``)
    or ``give_up()`` (``TxResult.gave_up`` says which). ``statements`` needs an engine counted by
    :func:`airflow_adrq_testing.recording.counting.count_statements`."""
    failures: Counter[str] = Counter()
    made = [0]
    last: list[str | None] = [None]

    def attempt(session: Session, _callbacks: list[Any]) -> None:
        made[0] += 1
        counting.reset()
        work(session)
        if hold_s:
            time.sleep(hold_s)

    def on_retry(_n: int, found: Retryable) -> None:
        failures[found.kind.value] += 1
        last[0] = found.kind.value

    start = time.perf_counter()
    try:
        airflow_adrq.run_in_transaction(
            lambda: Session(engine),
            attempt,
            max_attempts=max_attempts,
            # Jittered, so two victims do not restart in lockstep; short, as a task's retry is.
            initial_wait=0.005,
            max_wait=0.05,
            on_retry=on_retry,
            deadline=deadline,
            stop=give_up,
        )
    except airflow_adrq.RetriesExhaustedError as exc:
        final = airflow_adrq.classify(exc.__cause__) if exc.__cause__ is not None else None
        if final is not None:
            failures[final.kind.value] += 1
        if exc.attempts >= max_attempts:
            reason = GAVE_UP_ATTEMPTS
        elif time.monotonic() >= deadline:
            reason = GAVE_UP_TIMEOUT
        else:
            reason = GAVE_UP_STOPPED
        elapsed = time.perf_counter() - start
        kind = final.kind.value if final is not None else last[0]
        return TxResult(False, exc.attempts, elapsed, 0, list(assets), dict(failures), reason, kind)
    elapsed = time.perf_counter() - start
    return TxResult(True, made[0], elapsed, counting.value(), list(assets), dict(failures), None, last[0])
