"""tests/dagster: Dagster in process (execute_in_process, execute_job, sensors evaluated directly), no daemon."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, instance_for_test


@pytest.fixture(scope="session")
def instance_home(tmp_path_factory) -> Path:
    """A Dagster home whose SQLite storages are created once: creating them takes seconds, copying them none."""
    home = tmp_path_factory.mktemp("instance_home")
    with instance_for_test(temp_dir=str(home)):
        pass
    return home


@pytest.fixture
def instance(instance_home, tmp_path_factory) -> Iterator[DagsterInstance]:
    """A real local Dagster instance in a home of the test's own: SQLite storage and the DefaultRunLauncher."""
    home = tmp_path_factory.mktemp("dagster_home")
    shutil.copytree(instance_home, home, dirs_exist_ok=True)
    with instance_for_test(temp_dir=str(home)) as inst:
        yield inst
