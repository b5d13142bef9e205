"""The pytest-xdist suite of the standalone run: one test per party, one xdist worker per test.

:mod:`airflow_adrq_bench.runner` runs it as ``python -m pytest --pyargs
airflow_adrq_bench.suite -n <producers + 1>`` with ``ADRQ_BENCH_PLAN`` naming the
plan JSON. With as many tests as workers, xdist's load scheduler deals the tests
round robin (fewer than two per worker), so every party is a process of its own;
the parties then meet at file barriers every round (:mod:`airflow_adrq_bench.barrier`).
"""
