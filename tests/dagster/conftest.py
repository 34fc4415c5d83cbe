"""tests/dagster: Dagster in process (execute_in_process, execute_job, sensors evaluated directly), no daemon.

The ``instance`` fixture (a local Dagster instance per test), ``store`` and ``db_url`` come from the root conftest.
"""
