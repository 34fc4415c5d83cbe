"""Hostile CLI input and schemas, round three: ``migrate --package`` (its typos, run as a separate process, are in
tests/process/test_cli_processes.py), and a database a newer release migrated."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from recovery_ext._cli import main
from recovery_ext._errors import MigrationError
from recovery_ext._store.migrations import load_migrations
from recovery_ext._store.schema import migrations_table
from recovery_ext._store.store import RecoveryStore
from recovery_pipelines.ontology_schema import MIGRATIONS


def test_a_good_migrations_package_still_migrates(tmp_path):
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    result = CliRunner().invoke(main, ["--database-url", url, "migrate", "--package", MIGRATIONS])
    assert result.exit_code == 0, result.output
    assert "applied" in result.output


def _migrated_by_a_newer_release(url: str) -> int:
    store = RecoveryStore(url)
    store.migrate()
    newest = load_migrations(store.dialect)[-1].version
    with store.write() as conn:
        conn.execute(insert(migrations_table).values(version=newest + 1, name="from_the_future",
                                                     applied_at=store.dialect.now()))
    store.close()
    return newest


@pytest.mark.parametrize("command", [["migrate"], ["migrate", "--print"], ["status"], ["pipelines", "list"],
                                     ["costs"], ["events"]])
def test_a_database_migrated_by_a_newer_release_is_refused_in_one_line_naming_both_versions(db_url, command):
    newest = _migrated_by_a_newer_release(db_url)
    result = CliRunner().invoke(main, ["--database-url", db_url, *command])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert f"{newest + 1:04d}" in lines[0] and f"({newest:04d}, recovery-ext " in lines[0]
    assert "newer release" in lines[0] and "up to date" not in lines[0]


def test_a_run_refuses_a_database_migrated_by_a_newer_release(db_url):
    newest = _migrated_by_a_newer_release(db_url)
    store = RecoveryStore(db_url)
    try:
        with pytest.raises(MigrationError, match=f"version {newest + 1:04d}, newer than this release knows"):
            store.migrate()
    finally:
        store.close()
