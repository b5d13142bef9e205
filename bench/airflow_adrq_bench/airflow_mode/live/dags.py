"""The DAG files of the live run, written into the deployment's scratch ``dags_folder``.

Three files, so that a producer task process (which parses its own DAG's file)
does not also parse the consumer DAGs: ``producer_dags`` DAGs of one task
mapped over ``instances`` instances, each with the same ``outlets`` assets
(``a0``, ``a1`` ...; with ``own_assets`` each DAG its own, ``p0a0`` ...),
which meet at a file-system barrier and finish within ``spread_s`` of each
other, so that the burst's task-success calls (``PATCH
/execution/task-instances/{id}/state``: the asset events and queue rows) reach
the api-server together; ``consumers`` DAGs on ``a0 | a1 | ...`` (with
``own_assets`` half of them on ``a0 & a1 & ...``), each one
``EmptyOperator`` (the scheduler completes it without the executor); one
warm-up DAG whose outlet no DAG consumes. They use ``airflow.sdk`` and the
standard provider only; their settings are a JSON literal at the top.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from airflow_adrq_bench.airflow_mode.live.config import (
    WARM_ASSET,
    WARM_DAG,
    LiveSizes,
    all_of_consumers,
    asset_names,
    consumer_dag_ids,
    producer_assets,
    producer_dag_ids,
)

__all__ = ["CONSUMERS_FILE", "PRODUCERS_FILE", "WARMUP_FILE", "write_dag_files"]

PRODUCERS_FILE: Final = "adrq_live_producers.py"
CONSUMERS_FILE: Final = "adrq_live_consumers.py"
WARMUP_FILE: Final = "adrq_live_warmup.py"

_HEADER = '''\
"""{title}

Written by `airflow-adrq bench --airflow --live` into its scratch deployment;
rewritten on every run (edits are lost).
"""

from __future__ import annotations

import datetime
import json
import os
import random
import time
from pathlib import Path

SETTINGS = json.loads({settings!r})
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
'''

_BARRIER = '''

def wait_for_the_burst(
    folder: Path, name: str, expected: int, timeout: float, lead: float, spread: float
) -> None:
    """Leave a file in ``folder/arrived``; the first to see ``expected`` links ``folder/go`` (atomic)
    holding ``now + lead``; all sleep until then plus 0..``spread`` s. After ``timeout`` s, go alone
    (a retry finds ``go`` written and goes at once)."""
    arrived = folder / "arrived"
    arrived.mkdir(parents=True, exist_ok=True)
    (arrived / name).touch()
    go = folder / "go"
    waited_until = time.monotonic() + timeout
    while not go.exists():
        if sum(1 for _ in arrived.iterdir()) >= expected:
            draft = folder / f"go.{os.getpid()}"
            draft.write_text(repr(time.time() + lead))
            try:
                os.link(draft, go)
            except FileExistsError:
                pass
            finally:
                draft.unlink()
            break
        if time.monotonic() > waited_until:
            return
        time.sleep(0.02)
    deadline = float(go.read_text()) + random.uniform(0.0, spread)
    time.sleep(max(0.0, deadline - time.time()))
'''

_PRODUCERS = '''
from airflow.sdk import DAG, Asset, get_current_context, task

for dag_id, names in SETTINGS["outlets"].items():
    OUTLETS = [Asset(name) for name in names]
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_tasks=SETTINGS["instances"],
        tags=["adrq-live"],
    ):

        @task(
            outlets=OUTLETS,
            retries=SETTINGS["retries"],
            retry_delay=datetime.timedelta(seconds=2),
        )
        def produce(i: int) -> None:
            """Finish together with every other instance of the burst; the success call emits OUTLETS."""
            context = get_current_context()
            burst = str(context["dag_run"].conf.get("burst", context["run_id"]))
            ti = context["ti"]
            wait_for_the_burst(
                Path(SETTINGS["barrier_dir"]) / burst,
                f"{ti.dag_id}.{ti.map_index}",
                SETTINGS["expected"],
                SETTINGS["barrier_timeout_s"],
                SETTINGS["lead_s"],
                SETTINGS["spread_s"],
            )

        produce.expand(i=list(range(SETTINGS["instances"])))
'''

_CONSUMERS = """
import functools
import operator

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset

# Asset("a0") | Asset("a1") | ...: one event of any of them queues every consumer;
# the DAGs in SETTINGS["all_of"] run on Asset("a0") & Asset("a1") & ...: one event of each.
ASSETS = [Asset(name) for name in SETTINGS["assets"]]
ANY_OF = functools.reduce(operator.or_, ASSETS)
ALL_OF = functools.reduce(operator.and_, ASSETS)

for dag_id in SETTINGS["dag_ids"]:
    schedule = ALL_OF if dag_id in SETTINGS["all_of"] else ANY_OF
    with DAG(dag_id=dag_id, schedule=schedule, start_date=START, catchup=False, tags=["adrq-live"]):
        EmptyOperator(task_id="done")
"""

_WARMUP = '''
from airflow.sdk import DAG, Asset, task

with DAG(
    dag_id=SETTINGS["dag_id"],
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_tasks=SETTINGS["instances"],
    tags=["adrq-live"],
):

    @task(outlets=[Asset(SETTINGS["asset"])])
    def warm(i: int) -> None:
        """Nothing: the run exists to send every execution-API call once before the bursts."""

    warm.expand(i=list(range(SETTINGS["instances"])))
'''


def _render(title: str, settings: Mapping[str, object], *parts: str) -> str:
    return _HEADER.format(title=title, settings=json.dumps(settings, sort_keys=True)) + "".join(parts)


def write_dag_files(dags_folder: Path, barrier_dir: Path, sizes: LiveSizes) -> list[Path]:
    """Write the three DAG files for ``sizes`` into ``dags_folder``; returns their paths."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    producers = {
        "outlets": {d: producer_assets(sizes, p) for p, d in enumerate(producer_dag_ids(sizes))},
        "instances": sizes.instances,
        "expected": sizes.tasks_per_burst,
        "retries": sizes.retries,
        "barrier_dir": str(barrier_dir),
        "barrier_timeout_s": sizes.barrier_s,
        "lead_s": sizes.lead_s,
        "spread_s": sizes.spread_s,
    }
    consumers = {
        "dag_ids": consumer_dag_ids(sizes),
        "assets": asset_names(sizes),
        "all_of": all_of_consumers(sizes),
    }
    warmup = {"dag_id": WARM_DAG, "asset": WARM_ASSET, "instances": sizes.tasks_per_burst}
    files = {
        PRODUCERS_FILE: _render(
            "Producer DAGs: one mapped task each, every instance of a DAG with the same outlets.",
            producers,
            _BARRIER,
            _PRODUCERS,
        ),
        CONSUMERS_FILE: _render(
            "Consumer DAGs: each one EmptyOperator on a0 | a1 | ... (or a0 & a1 & ...)", consumers, _CONSUMERS
        ),
        WARMUP_FILE: _render("The warm-up DAG: every execution-API call once.", warmup, _WARMUP),
    }
    for name, text in files.items():
        (dags_folder / name).write_text(text)
    return [dags_folder / name for name in files]
