"""Test support: helpers the tests share (never imported by airflow_adrq)."""
