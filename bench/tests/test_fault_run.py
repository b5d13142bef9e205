"""Bounded random-kill run (the full one is ``airflow-adrq bench --faults``).

Producers commit through ``run_in_transaction`` while a killer terminates
their connections at random. Nothing may be duplicated or half-written, and
the only errors a caller may see are ``CommitOutcomeUnknownError`` (the
connection died with COMMIT in flight) and ``RetriesExhaustedError``.
"""

from __future__ import annotations

import pytest

from airflow_adrq_bench.load import FaultSizes, run_faults

pytestmark = [pytest.mark.backends("postgresql", "mysql"), pytest.mark.slow]


def test_random_kills_leave_nothing_duplicated_or_half_written(db_url):
    # One kill per transaction (and at most one more, on its idle pooled connection just before it),
    # so kills alone never exhaust the bench's 8 attempts: what is checked is that no kill costs more
    # than the attempt it hit, on a fast or a loaded machine alike (kills by the clock alone chain on
    # a slow one: an attempt longer than the time between kills is hit again and again).
    sizes = FaultSizes(
        producers=4,
        transactions=20,
        fanout=8,
        kill_every_s=0.04,
        max_attempts=8,
        one_kill_per_transaction=True,
    )
    run = run_faults(db_url, sizes, seed=7, log=lambda _line: None)

    assert run.transactions == 80
    assert run.kills > 5, "the killer must actually hit connections for this to test anything"
    assert sum(run.retries.values()) > 0
    assert run.acceptable_errors_only, run.raised
    assert run.duplicate_events == 0
    assert run.half_written == 0
    assert run.queue_rows_exact
    # Every kill costs at most one retry; the budget is never exhausted here.
    assert run.completed + run.raised.get("CommitOutcomeUnknownError", 0) == run.transactions, run.as_dict()
