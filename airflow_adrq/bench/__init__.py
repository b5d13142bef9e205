"""``airflow-adrq bench``: the loop versions against the set-based ones, on a real database.

Modules, one job each:

* :mod:`.config`     -- sizes, strategy and scenario names, the run plan (JSON);
* :mod:`.strategies` -- what "queue one asset" means for each strategy;
* :mod:`.counting`   -- statements per transaction;
* :mod:`.dataset`    -- scratch database, schema, seed data, exact-rows check;
* :mod:`.barrier`    -- the file barrier the producer processes start rounds on;
* :mod:`.engine`     -- producer and consumer loops, fan-out sweep;
* :mod:`.report`     -- aggregation, table, JSON, PNG;
* :mod:`.runner`     -- runs the pytest-xdist suite (:mod:`.suite`) and reports;
* :mod:`.cli`        -- ``add_bench_parser(subparsers)`` for ``airflow-adrq bench``.
"""
