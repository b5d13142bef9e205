"""The api-server's memory sampler (``live/memory.py``): on real processes, then in a tiny live run.

The first tests run a real process tree (a Python parent that starts a child, which then allocates a
known amount), no deployment: the sampler must see the child and the allocation in the sum. The
live run is the smallest deployment with more than one api-server process (``--api-workers 2``:
uvicorn's supervisor and two worker processes) on PostgreSQL's shape (two schedulers, PgBouncer,
CeleryExecutor), the plug-in only: the sample must be real, i.e. non-zero, taken during the bursts
from the tree of the ``airflow api-server`` process the deployment started, its workers included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from airflow_adrq_bench import verdict
from airflow_adrq_bench.airflow_mode import main as airflow_mode_main
from airflow_adrq_bench.airflow_mode.config import LIVE_SMALL as SMALL
from airflow_adrq_bench.airflow_mode.config import LiveError
from airflow_adrq_bench.airflow_mode.live import memory, report

#: What the child allocates (and touches, so that it is resident), MB.
CHILD_MB = 200
#: VmHWM against a sampled RSS, MB: the kernel's RSS counters are per-CPU and read approximately
#: (statm and status a moment apart), and both are rounded to 0.1 MB: 272.7 against 272.8 was seen.
SLACK_MB = 1.0

# The parent starts the child and waits; the child waits for "go" on stdin (relayed by the parent),
# allocates, says "held" and waits for its stdin to close.
_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c", {child!r}], stdin=subprocess.PIPE, stdout=sys.stdout
    )
    print("started", flush=True)
    child.stdin.write(sys.stdin.readline().encode())
    child.stdin.flush()
    sys.stdin.readline()
    child.stdin.close()
    child.wait()
    """
)
_CHILD = textwrap.dedent(
    f"""
    import sys
    sys.stdin.readline()
    held = bytearray({CHILD_MB} * 1024 * 1024)
    for i in range(0, len(held), 4096):
        held[i] = 1
    print("held", flush=True)
    sys.stdin.read()
    """
)


def _tree():
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(child=_CHILD)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout.readline().strip() == "started"
    return parent


def test_the_sum_covers_the_whole_tree_and_sees_a_child_allocate():
    parent = _tree()
    try:
        child = psutil.Process(parent.pid).children()[0]
        with memory.Sampler(parent.pid) as sampler:
            sampler.mark("idle")
            time.sleep(0.5)
            sampler.mark("allocating")
            parent.stdin.write("go\n")
            parent.stdin.flush()
            assert parent.stdout.readline().strip() == "held"
            time.sleep(0.5)
        summary = sampler.summary()
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
        parent.stdout.close()
    assert summary["error"] is None and summary["root_pid"] == parent.pid
    assert [p["pid"] for p in summary["processes"]] == [parent.pid, child.pid]  # the root first
    assert "-c" in summary["processes"][0]["command"]
    # About 10 samples a second; the allocation in the sum, the child's own peak and its VmHWM.
    assert summary["samples"] >= 8 and summary["interval_ms"]["p50"] < 150
    idle, allocating = summary["per_mark"]["idle"], summary["per_mark"]["allocating"]
    assert allocating - idle >= 0.9 * CHILD_MB, summary
    assert summary["peak_mb"] == allocating and summary["before_mb"] <= idle
    child_seen = summary["processes"][1]
    assert child_seen["peak_rss_mb"] >= CHILD_MB
    assert child_seen["hwm_mb"] >= child_seen["peak_rss_mb"] - SLACK_MB
    assert summary["hwm_sum_mb"] >= summary["peak_mb"] - SLACK_MB  # each process's own peak bounds the sum's
    assert summary["threads_before"] >= 2


def test_a_pid_that_is_not_running_is_an_error_before_any_sample():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(LiveError, match="api-server's memory: NoSuchProcess"), memory.Sampler(gone.pid):
        pass


@pytest.mark.slow
@pytest.mark.backends("postgresql")
def test_tiny_live_run_samples_the_api_servers_process_tree(fresh_db_url, broker, tmp_path, capsys):
    out = tmp_path / "live"
    argv = ["--airflow", "--live", "--small", "--db", fresh_db_url, "--out", str(out), "--time-limit", "600"]
    shape = ("--schedulers", "2", "--pgbouncer", "--executor", "celery", "--api-workers", "2", *broker)
    status = airflow_mode_main([*argv, *shape, "--manager", "plugin"])
    captured = capsys.readouterr()
    print(captured.out)
    assert (out / "live.json").exists(), f"the live run did not start (exit {status}): {captured.err[-3000:]}"
    raw = json.loads((out / "live.json").read_text())
    (cell,) = raw["cells"]
    assert cell["error"] is None, f"{cell['error']} (api-server log: {cell['api_server_log']})"
    sampled = cell["api_server_memory"]
    assert sampled["error"] is None, sampled
    # Every 100 ms through the bursts: at least a few seconds' worth, one mark per burst.
    assert sampled["samples"] >= 20 and list(sampled["per_mark"]) == SMALL.run_ids, sampled
    processes = sampled["processes"]
    root = processes[0]
    # The tree of the process the deployment started (`airflow api-server`, which retitles itself
    # `airflow api_server -- host:...`) and uvicorn's two spawned workers (with multiprocessing's
    # resource tracker), each counted once.
    assert root["pid"] == sampled["root_pid"] and "api_server" in root["command"], processes
    assert len(processes) >= 3 and len({p["pid"] for p in processes}) == len(processes), processes
    workers = [p for p in processes[1:] if "spawn_main" in p["command"]]
    assert len(workers) == 2, processes
    # Non-zero, and what an Airflow process takes: each worker imports the whole api-server (> 100 MB).
    for process in (root, *workers):
        assert process["peak_rss_mb"] > 20 and process["hwm_mb"] >= process["peak_rss_mb"] - SLACK_MB, process
    assert all(w["peak_rss_mb"] > 100 for w in workers), workers
    assert sampled["peak_mb"] >= sum(p["peak_rss_mb"] for p in (root, *workers)) * 0.8, sampled
    assert sampled["before_mb"] > 100 and sampled["threads_max"] >= sampled["threads_before"] > 3
    # The workers' pools hold connections to PgBouncer from the warm-up on; the bursts' calls overlap.
    assert sampled["db_connections_max"] >= sampled["db_connections_before"] > 0, sampled
    assert cell["in_flight"]["all"] >= cell["in_flight"]["patch_state"] >= 1, cell["in_flight"]
    # The report shows it, and the verdict judges the plug-in alone as n/a (no stock to compare).
    text = " ".join((out / "live.md").read_text().split())
    assert f"| {sampled['before_mb']:.0f} / {sampled['peak_mb']:.0f} (" in text, text[:3000]
    burst = {ln["what"]: ln for ln in raw["verdict"]}
    assert burst[report.MEMORY.what]["verdict"] == "n/a" and burst[report.P99_BURST.what]["verdict"] == "n/a"
    # The verdict's two new lines keep it within 100 columns; the lock sampler's line is wider on its
    # own (its target and measured text, ~116 columns on PostgreSQL), so it is left out here.
    lines = [verdict.Line(**ln) for ln in raw["verdict"] if ln["what"] != report.WAIT.what]
    assert max(map(len, verdict.format_verdict(lines).splitlines())) <= 100, captured.out
    assert status == 0, raw["problems"]
