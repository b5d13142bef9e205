"""``airflow-adrq bench --airflow --accounting``: asset events that no run consumes, through Airflow itself.

::

    airflow-adrq bench --airflow --accounting                # SQLite + every PostgreSQL/MariaDB server found
    airflow-adrq bench --airflow --accounting --quick        # smaller rounds
    airflow-adrq bench --airflow --accounting --db postgresql://root@127.0.0.1/postgres

The library benchmark's lost-events table (``airflow-adrq bench``, scenario
``lost_events``) applies a copy of Airflow 3.3.2's scheduler rule. This mode
measures the same thing with Airflow's own code on both sides:

* **producers**: the Airflow mode's worker processes (:mod:`.worker`), each
  bound to one asset manager through ``[core] asset_manager_class`` (``stock``:
  Airflow's ``AssetManager``; ``plugin``: ``airflow_adrq.airflow.AdrqAssetManager``),
  run task-success transactions through ``TaskInstance.register_asset_changes_in_db``
  with one outlet, hold them open ``hold`` ms (the rest of task success), and
  COMMIT;
* **consumer**: one more Airflow process running the scheduler's own
  ``SchedulerJobRunner._create_dagruns_for_dags`` (``DagModel.dags_needing_dagruns``,
  then ``_create_dag_runs_asset_triggered``, then its guarded COMMIT), pass
  after pass (1 ms apart) while the producers run, on a ``SchedulerJobRunner``
  with a ``Job`` row whose loop is never started. Runs are created QUEUED and
  nothing executes. The consumer DAGs are real serialized DAGs
  (``airflow.sdk.DAG(schedule=[Asset(...)])`` written by Airflow's
  ``update_dag_parsing_results_in_db``: ``dag``, ``serialized_dag``,
  ``dag_version``, ``asset_expression``, schedule references).

Per database, hold and manager (a *cell*, with an asset and consumer DAGs
of its own), after a warm-up transaction per producer on another asset:

1. the consumer starts passing; every producer of the manager starts at a
   barrier and commits ``transactions`` transactions (a deadlock or other
   retryable error replays the transaction, as in the Airflow mode);
2. once they are done the consumer stops and *drains*: passes until none of
   the cell's queue rows is left, so every committed queue row became a run;
3. a *sentinel* event of the asset is committed by one producer of the same
   manager, and the consumer drains again. An event whose queue row already
   existed waits for the next run of its DAG (Airflow keeps the row's
   ``created_at``): it is *late*, not lost; the sentinel's runs pick such
   events up. Only what even they leave out was consumed by no run, ever.

Each pair (event, consumer DAG) is then *consumed* (by a run created before
the sentinel), *late* (only by the sentinel's runs) or *unconsumed* (in no
run's ``consumed_asset_events``, the ``dagrun_asset_event`` table); an event
takes the worst of its pairs. Checks (exit status 1 when one fails): the
events in the database are exactly the committed transactions; every event is
in exactly one class; no run of the cell's DAGs consumed an event of another
asset; every consumer DAG consumed the sentinel; no queue row is left; and the
plug-in leaves no more events unconsumed than stock at the same hold.

The controller never imports Airflow: the producers are :mod:`.worker`
processes (started and driven as in :mod:`.run`) and the consumer is a
process of this module (:func:`consumer_main`).
"""

from airflow_adrq_bench.airflow_mode.accounting.classify import PairClasses, classify
from airflow_adrq_bench.airflow_mode.accounting.cli import build_parser, main
from airflow_adrq_bench.airflow_mode.accounting.config import (
    DEFAULT,
    MANAGERS,
    QUICK,
    AccountingError,
    AccountingSizes,
)
from airflow_adrq_bench.airflow_mode.accounting.consumer import consumer_main
from airflow_adrq_bench.airflow_mode.accounting.controller import compare, run
from airflow_adrq_bench.airflow_mode.accounting.report import format_tables

__all__ = [
    "DEFAULT",
    "MANAGERS",
    "QUICK",
    "AccountingError",
    "AccountingSizes",
    "PairClasses",
    "build_parser",
    "classify",
    "compare",
    "consumer_main",
    "format_tables",
    "main",
    "run",
]
