"""tests/store: the application tables through the store, each test on SQLite and on a real PostgreSQL.

The ``store`` and ``db_url`` fixtures come from the root conftest; nothing here starts Dagster.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from recovery_ext._cli import main


@pytest.fixture
def cli(store, db_url):
    """``cli(*args, code=0)``: run ``recovery-ext`` on the test's database and check its exit status."""
    runner = CliRunner()

    def invoke(*args, code=0):
        result = runner.invoke(main, ["--database-url", db_url, *args], catch_exceptions=False)
        assert result.exit_code == code, result.output
        return result

    return invoke
