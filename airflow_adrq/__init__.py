"""airflow-adrq."""
