"""``python -m airflow_adrq_bench.airflow_mode``: the same as ``airflow-adrq bench --airflow``."""

import sys

from airflow_adrq_bench.airflow_mode import main

if __name__ == "__main__":
    sys.exit(main())
