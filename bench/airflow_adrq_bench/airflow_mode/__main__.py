"""``python -m airflow_adrq_bench.airflow_mode``: the same as ``airflow-adrq bench --airflow``."""

from airflow_adrq_bench.airflow_mode import main

if __name__ == "__main__":
    raise SystemExit(main())
