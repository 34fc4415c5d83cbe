"""tests/store: the application tables through the store, each test on SQLite and on a real PostgreSQL.

The ``store``, ``db_url`` and ``cli`` fixtures come from the root conftest; nothing here starts Dagster.
"""
