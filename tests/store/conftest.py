"""tests/store: the application tables through the store, each test on SQLite and on a real PostgreSQL.

The ``store`` and ``db_url`` fixtures come from the root conftest; nothing here starts Dagster.
"""
