"""``airflow-adrq bench``: Airflow 3.3.2's whole ``register_asset_change`` against ours, on a real database.

Modules, one job each:

* :mod:`.config`     -- sizes, strategy and scenario names, the run plan (JSON);
* :mod:`.strategies` -- what "a transaction emits these assets" means for each strategy
  (Airflow 3.3.2's whole path, :mod:`airflow_adrq_bench.baselines`, or ours);
* :mod:`.dataset`    -- the servers (:class:`~.dataset.Target`), scratch database, schema, seed data,
  exact-rows check;
* :mod:`.barrier`    -- the file barrier the producer processes start rounds on;
* :mod:`.engine`     -- producer and consumer loops (Airflow 3.3.2's scheduler rule for
  the lost-events rounds), fan-out sweep, raw-SQL ratio;
* :mod:`.rawsql`     -- the hand-written SQL reference of the ratio row;
* :mod:`.report`     -- aggregation, table, JSON, PNG;
* :mod:`.runner`     -- runs the pytest-xdist suite (:mod:`.suite`) and reports;
* :mod:`.cli`        -- ``main(argv)``: ``airflow-adrq bench`` and its modes (an entry point);
* :mod:`.options`    -- what every mode's command line shares;
* :mod:`.load`       -- ``--faults`` and ``--soak``: producers under connection kills and sustained load;
* :mod:`.baselines`  -- the loop versions airflow-adrq replaces, kept faithfully;
* :mod:`.scheduler`  -- what Airflow 3.3.2's scheduler does to the queue, for the consumer loops;
* :mod:`.residual`   -- ``python -m airflow_adrq_bench.residual``: producers of different assets
  feeding one DAG against a scheduler step, events lost or consumed twice, COMMIT-to-run times;
* :mod:`.stats`, :mod:`.tables`, :mod:`.plots`, :mod:`.errors` -- percentiles, Markdown/JSON
  tables, the PNG set-up and the one error type every mode shares;
* :mod:`.suite`      -- the pytest-xdist suite the standalone run drives, one test per producer;
* :mod:`.airflow_mode` -- ``bench --airflow``: the managers through Apache Airflow's own code
  (scratch databases made by ``airflow db migrate``), with ``accounting/`` (events no run
  consumes, through Airflow's scheduler), ``live/`` (``--live``: a deployment it starts itself)
  and its own residual (Airflow's ``dags_needing_dagruns`` and ``_create_dag_runs_asset_triggered``).
"""

__version__ = "0.1.0"
