"""The pytest-xdist benchmark suite: one test per party, one xdist worker per test.

Run by :mod:`airflow_adrq_bench.runner` as
``python -m pytest --pyargs airflow_adrq_bench.suite -n <producers + 1>`` with
``ADRQ_BENCH_PLAN`` naming the plan JSON. With as many tests as workers,
xdist's load scheduler sends exactly one test to each worker (it deals
tests round robin when there are fewer than two per worker), so every party
is its own process. The parties then meet at file barriers every round.
"""
