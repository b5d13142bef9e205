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
    # 20 attempts, not the bench's 8: under load an attempt (with its new connection) can take
    # longer than the 40 ms between kills, and 8 kills of one transaction in a row then happen
    # in about one run in four; 20 in a row do not. What is checked is that no kill costs more
    # than the attempt it hit, not how lucky the killer is.
    sizes = FaultSizes(producers=4, transactions=20, fanout=8, kill_every_s=0.04, max_attempts=20)
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
