"""tests/dagster: Dagster in process (execute_in_process, execute_job, sensors evaluated directly), no daemon."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dagster import DagsterInstance, instance_for_test


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    """A real local Dagster instance in a temporary home: SQLite storage and the DefaultRunLauncher."""
    with instance_for_test() as inst:
        yield inst
