"""tests/unit: no application tables and no Dagster instance — the classifier and retries, settings, the package's
layout and packaging. The classifier's tests still raise real driver errors against the test PostgreSQL server.
"""
