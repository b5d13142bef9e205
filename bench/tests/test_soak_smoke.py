"""A few seconds of the soak (the full one is ``airflow-adrq bench --soak``), so it cannot rot."""

from __future__ import annotations

import pytest

from airflow_adrq_bench.load import SoakSizes, run_soak

pytestmark = [pytest.mark.backends("postgresql", "mysql"), pytest.mark.slow]


def test_soak_smoke(db_url):
    run = run_soak(db_url, SoakSizes(producers=4, transactions=15, samples=3), log=lambda _line: None)

    assert run.committed == 60 and run.failed == {}
    assert run.deadlocks == 0
    assert run.rows_exact, run.rows
    # Sampled before, during and after; every pooled connection is back at the end.
    assert len(run.samples) >= 3 and run.samples[-1][2] == 0
