"""The verdict ``airflow-adrq bench`` prints last: airflow-adrq judged, Airflow's loops beside it, no
ratio over a side that deadlocked or did not finish, counts that add up to the rows."""

from __future__ import annotations

import math

from airflow_adrq_bench import verdict


def _row(strategy, *, scenario="single", tx_per_s=10.0, deadlocks=0, abandoned=0, not_started=0, exact=True):
    return {
        "db": "postgresql",
        "scenario": scenario,
        "strategy": strategy,
        "planned": 12,
        "deadlocks": deadlocks,
        "abandoned": abandoned,
        "not_started": not_started,
        "rows_exact": exact,
        "tx_per_s": tx_per_s,
    }


RAW = {"targets": [{"name": "postgresql", "version": "PostgreSQL 15"}]}


def _by_what(lines):
    return {line.what: line for line in lines}


def test_all_met_with_the_loops_beside_and_the_table_fits_100_columns():
    rows = [_row("airflow_3_3", tx_per_s=5.0), _row("sorted_loop", tx_per_s=8.0), _row("commit_time")]
    rows += [
        _row(s, scenario="multi_outlet", deadlocks=d) for s, d in (("airflow_3_3", 3), ("commit_time", 0))
    ]
    lines = verdict.standalone(RAW, rows, [])
    assert [line.verdict for line in lines] == ["met"] * 4
    by = _by_what(lines)
    # Each side's own figures, over every scenario: sorted_loop ran the single rounds only.
    assert (by["deadlocks"].measured, by["deadlocks"].beside) == ("0", ("3", "0"))
    assert (by["not committed"].measured, by["not committed"].beside) == ("0 of 24", ("0 of 24", "0 of 12"))
    assert by["tx/s, single outlet"].measured == "10 tx/s"
    assert by["tx/s, single outlet"].beside == ("2.00x", "1.25x")
    # 2 of 12 is 0.17x, but too few to tell from the 0.2x target: unclear, and said so.
    text = verdict.format_sides(RAW, [*lines, _lost(12, 230), _lost(2, 12)])
    assert "5 met, 0 MISSED, 1 unclear of 6 targets" in text
    assert "unclear (the target lies within the measurement's noise): postgresql pairs lost" in text
    assert "| airflow-adrq | airflow_3_3 | sorted_loop | verdict |" in text
    assert max(map(len, text.splitlines())) <= 100


def test_a_loop_that_deadlocked_or_did_not_finish_gets_no_ratio():
    rows = [
        _row("airflow_3_3", tx_per_s=0.1, deadlocks=7, abandoned=3, not_started=2),
        _row("sorted_loop", tx_per_s=0.5, abandoned=1),
        _row("commit_time"),
    ]
    line = _by_what(verdict.standalone(RAW, rows, []))["tx/s, single outlet"]
    assert line.beside == ("deadlocked (7)", "not done (1/12)") and line.verdict == "met"
    # A loop that committed everything but deadlocked on the way: no ratio either (it would measure
    # deadlock_timeout's wait), met.
    rows[0] = _row("airflow_3_3", tx_per_s=0.4, deadlocks=1)
    line = _by_what(verdict.standalone(RAW, rows, []))["tx/s, single outlet"]
    assert line.beside[0] == "deadlocked (1)" and line.verdict == "met"


def test_a_deadlock_or_inexact_rows_is_missed_and_named():
    rows = [_row("commit_time", deadlocks=1, exact=False), _row("airflow_3_3")]
    lines = verdict.standalone(RAW, rows, [])
    assert [m.what for m in verdict.missed(lines)] == [
        "deadlocks",
        "queue rows exact",
        "tx/s, single outlet",
    ]
    assert _by_what(lines)["tx/s, single outlet"].measured == "deadlocked"
    text = verdict.format_sides(RAW, lines)
    assert "1 met, 3 MISSED, 0 unclear of 4 targets" in text
    assert "MISSED: postgresql deadlocks; postgresql queue rows exact; postgresql tx/s" in " ".join(
        text.split()
    )


def _lost(ours, stock):
    lost = [
        {"db": "postgresql", "strategy": "commit_time", "lost_pairs": ours},
        {"db": "postgresql", "strategy": "airflow_3_3", "lost_pairs": stock},
    ]
    return _by_what(verdict.standalone(RAW, [], lost))["pairs lost"]


def test_lost_events_are_judged_on_the_counts_noise():
    assert _lost(300, 1000).verdict == "MISSED"  # 0.3x, clearly above 0.2x
    # 0.3x too, but 3 and 10 are too few to tell from 0.2x.
    assert _lost(3, 10).verdict == "unclear" and _lost(3, 10).measured == "3 (0.30x)"
    assert (_lost(0, 10).measured, _lost(0, 10).beside) == ("0", ("10", "-"))
    assert _lost(0, 0).verdict == "met"
    assert _lost(1, 0).verdict == "MISSED"


def test_raw_sql_is_judged_for_the_report_not_the_verdict():
    ratio = {"fanout": 1, "ours_p50_ms": 3.0, "ours_p95_ms": 4.0, "raw_p50_ms": 1.0, "raw_p95_ms": 1.2}
    raw = {**RAW, "raw_sql_ratio": {"postgresql": [{**ratio, "ratio_p50": 3.0}]}}
    assert verdict.standalone(raw, [], []) == []
    line = verdict.raw_sql("postgresql", raw["raw_sql_ratio"]["postgresql"])
    assert line is not None and (line.measured, line.verdict) == ("3.00x", "MISSED")


def test_a_ratio_is_judged_on_its_spread_and_overlapping_spreads_say_so():
    target = verdict.RAW_SQL  # <= 2x
    clear = verdict.ratio_line("pg", target, 3.0, 1.0, spreads=[(2.9, 3.1), (0.95, 1.05)])
    assert clear.verdict == "MISSED" and clear.measured == "3.00x (2.76-3.26x)"
    # 2.1x, but 2x is inside the ratio's spread: within the noise, neither met nor missed.
    noisy = verdict.ratio_line("pg", target, 2.1, 1.0, spreads=[(1.9, 2.3), (0.9, 1.1)])
    assert noisy.verdict == "unclear" and noisy.measured == "2.10x (1.73-2.56x)"
    same = verdict.ratio_line("pg", verdict.SPEED, 0.9, 1.0, spreads=[(0.8, 1.0), (0.9, 1.1)])
    assert same.verdict == "unclear" and same.measured == "0.90x (spreads overlap)"
    sure = verdict.ratio_line("pg", target, 1.5, 1.0, spreads=[(1.4, 1.6), (0.95, 1.05)])
    assert sure.verdict == "met"
    # Large ratios keep 3 figures: the cells stay narrow.
    big = verdict.ratio_line("pg", verdict.SPEED, 18.56, 1.0, spreads=[(15.8, 22.79), (0.99, 1.0)])
    assert big.measured == "18.6x (15.8-23.0x)"
    text = verdict.format_verdict([noisy, sure])
    assert "1 met, 0 MISSED, 1 unclear of 2 targets" in text
    # One round a side: no spread, the ratio alone.
    assert verdict.ratio_line("pg", target, 2.1, 1.0, spreads=[(math.nan,) * 2] * 2).verdict == "MISSED"


def test_one_round_speed_takes_its_spread_from_the_transactions_latencies():
    # 0.95x, but each side's median latency is less sure than the difference: unclear, no miss.
    latency = {"ci_low_ms": 50.0, "p50_ms": 100.0, "ci_high_ms": 200.0}
    ours, base = {**_row("commit_time", tx_per_s=9.5), **latency}, {**_row("sorted_loop"), **latency}
    line = _by_what(verdict.standalone(RAW, [ours, base], []))["tx/s, single outlet"]
    assert line.beside == ("-", "0.95x (0.24-3.80x)") and line.verdict == "unclear"
    # The same 0.95x from surer medians: not slower beyond the noise (at least 0.8x), met.
    latency = {"ci_low_ms": 95.0, "p50_ms": 100.0, "ci_high_ms": 105.0}
    ours, base = {**ours, **latency}, {**base, **latency}
    line = _by_what(verdict.standalone(RAW, [ours, base], []))["tx/s, single outlet"]
    assert line.beside == ("-", "0.95x (0.86-1.05x)") and line.verdict == "met"
    # 0.5x, as sure: slower, MISSED.
    line = _by_what(verdict.standalone(RAW, [{**ours, "tx_per_s": 5.0}, base], []))["tx/s, single outlet"]
    assert line.verdict == "MISSED"


def test_the_counts_add_up_to_the_rows_n_a_included():
    lines = [
        verdict.line("pg", verdict.DEADLOCKS, 0, "0"),
        verdict.line("pg", verdict.SPEED, math.nan, "-"),
    ]
    assert verdict.summary(lines) == "1 met, 0 MISSED, 0 unclear, 1 n/a of 2 targets"
