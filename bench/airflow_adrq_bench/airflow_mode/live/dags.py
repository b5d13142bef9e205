"""The live run's two DAG files (``airflow.sdk`` and the standard provider only; their settings a JSON
literal at the top), so that a producer task process, which parses its own DAG's file, does not
parse the consumers. Producers: ``producer_dags`` DAGs of one task mapped over ``instances``, whose
instances meet at a file-system barrier and finish within ``spread_s`` of each other, so that the
burst's task-success calls (the asset events and queue rows) reach the api-server together; and
the warm-up DAG. Consumers: ``consumers`` DAGs, each one ``EmptyOperator`` (the scheduler completes
it without the executor) on ``a0 | a1 | ...`` (with ``own_assets`` half of them on ``a0 & a1 & ...``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from airflow_adrq_bench.airflow_mode.config import WARM_DAG, LiveSizes

PRODUCERS_FILE: Final = "adrq_live_producers.py"
CONSUMERS_FILE: Final = "adrq_live_consumers.py"

_HEADER = '''\
"""{title}

Written by `airflow-adrq bench --airflow --live` into its scratch deployment;
rewritten on every run (edits are lost).
"""

from __future__ import annotations

import datetime
import json

SETTINGS = json.loads({settings!r})
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
'''

_PRODUCERS = '''
import random
import time
from pathlib import Path

from airflow.sdk import DAG, Asset, get_current_context, task


def wait_for_the_burst(folder: Path, name: str, settings: dict) -> None:
    """Leave a file in ``folder``; once every instance of the burst left one, sleep until the last
    one's arrival plus ``lead_s`` (the same moment for all), plus 0..``spread_s``. After
    ``barrier_timeout_s``, go alone (a retry finds them all there and goes at once)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).touch()
    give_up = time.monotonic() + settings["barrier_timeout_s"]
    while len(arrived := [f.stat().st_mtime for f in folder.iterdir()]) < settings["expected"]:
        if time.monotonic() > give_up:
            return
        time.sleep(0.02)
    finish = max(arrived) + settings["lead_s"] + random.uniform(0.0, settings["spread_s"])
    time.sleep(max(0.0, finish - time.time()))


for dag_id, names in SETTINGS["outlets"].items():
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_tasks=SETTINGS["instances"],
        tags=["adrq-live"],
    ):

        @task(
            outlets=[Asset(name) for name in names],
            retries=SETTINGS["retries"],
            retry_delay=datetime.timedelta(seconds=2),
        )
        def produce(i: int) -> None:
            """Finish together with every other instance of the burst; the success call emits the outlets."""
            context = get_current_context()
            burst = str(context["dag_run"].conf.get("burst", context["run_id"]))
            ti = context["ti"]
            wait_for_the_burst(Path(SETTINGS["barrier_dir"]) / burst, f"{ti.dag_id}.{ti.map_index}", SETTINGS)

        produce.expand(i=list(range(SETTINGS["instances"])))

with DAG(dag_id=SETTINGS["warm_dag"], schedule=None, start_date=START, catchup=False, tags=["adrq-live"]):

    @task(outlets=[Asset(SETTINGS["warm_asset"])])
    def warm(i: int) -> None:
        """Nothing: the run exists to send every execution-API call once before the bursts."""

    warm.expand(i=list(range(SETTINGS["expected"])))
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


def _render(title: str, settings: Mapping[str, object], body: str) -> str:
    return _HEADER.format(title=title, settings=json.dumps(settings, sort_keys=True)) + body


def write_dag_files(dags_folder: Path, barrier_dir: Path, sizes: LiveSizes) -> list[Path]:
    """Write the two DAG files for ``sizes`` into ``dags_folder``; returns their paths."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    producers = {
        "outlets": {d: sizes.outlets_of(p) for p, d in enumerate(sizes.producer_ids)},
        "instances": sizes.instances,
        "expected": sizes.tasks_per_burst,
        "retries": sizes.retries,
        "barrier_dir": str(barrier_dir),
        "barrier_timeout_s": sizes.barrier_s,
        "lead_s": sizes.lead_s,
        "spread_s": sizes.spread_s,
        "warm_dag": WARM_DAG,
        "warm_asset": "adrq_live_warm",
    }
    consumers = {"dag_ids": sizes.consumer_ids, "assets": sizes.assets, "all_of": sizes.all_of_ids}
    files = {
        PRODUCERS_FILE: _render(
            "Producer DAGs (one mapped task each, every instance of a DAG with the same outlets) and the "
            "warm-up DAG (every execution-API call once).",
            producers,
            _PRODUCERS,
        ),
        CONSUMERS_FILE: _render(
            "Consumer DAGs: each one EmptyOperator on a0 | a1 | ... (or a0 & a1 & ...)", consumers, _CONSUMERS
        ),
    }
    for name, text in files.items():
        (dags_folder / name).write_text(text)
    return [dags_folder / name for name in files]
