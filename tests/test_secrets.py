"""No secret anywhere: planted passwords (source DB, application DB) and an API key never reach a table,
the Dagster storage folder (run config snapshots, event logs, IO-manager pickles, compute logs) or the CLI."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance
from sqlalchemy import MetaData, select

from conftest import create_pg_database, drop_pg_database
from recovery_ext.cli import main
from recovery_ext.integration import execute_in_process
from recovery_ext.pipelines.sample_data import create_sample_database
from recovery_ext.store import RecoveryStore

SOURCE_PASSWORD = "PlantedSourcePw-7f3a9c"
APP_PASSWORD = "PlantedAppPw-b81d44"
API_KEY = "sk-PlantedApiKey0123456789abcdef"
SECRETS = (SOURCE_PASSWORD, APP_PASSWORD, API_KEY)


def with_password(url: str, password: str) -> str:  # trust auth accepts any password: it is only planted
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@")


@pytest.fixture
def source_db(pg_admin):
    url = create_pg_database(pg_admin)
    create_sample_database(url.replace("postgresql://", "postgresql+psycopg://"))
    yield url
    drop_pg_database(pg_admin, url)


def every_table_as_text(url: str) -> str:
    store = RecoveryStore(url)
    meta = MetaData()
    meta.reflect(store.engine)
    with store.engine.connect() as conn:
        text = "\n".join(repr(conn.execute(select(t)).all()) for t in meta.tables.values())
    store.close()
    return text


def files_containing(folder: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("source_port", ["5432", "54x2"], ids=["valid-url", "port-typo"])
def test_planted_passwords_and_api_key_appear_nowhere(source_port, source_db, pg_url, tmp_path, monkeypatch, caplog,
                                                      capfd):
    app_url = with_password(pg_url, APP_PASSWORD)
    source_url = with_password(source_db, SOURCE_PASSWORD).replace(":5432/", f":{source_port}/")
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("RECOVERY_DATABASE_URL", app_url)
    monkeypatch.setenv("RECOVERY_SOURCE_URL", source_url)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    caplog.set_level(logging.DEBUG)
    from recovery_ext.pipelines.assembly import build_definitions

    defs = build_definitions()
    with DagsterInstance.local_temp(str(home)) as instance:
        result = execute_in_process(defs.get_job_def("ontology_extraction"), instance=instance, raise_on_error=False)
    assert result.success == (source_port == "5432")
    store = RecoveryStore(app_url)
    (p,) = store.list_pipelines()
    cli_output = "".join(CliRunner().invoke(main, ["--database-url", app_url, *args]).output for args in (
        ["status"], ["pipelines", "list"], ["pipelines", "show", str(p.id)], ["pipelines", "show", str(p.id),
                                                                                "--json"], ["events", "--json"]))
    cli_output += CliRunner().invoke(main, ["--database-url", app_url.replace(":5432/", ":54x2/"), "status"]).output
    store.close()
    captured = capfd.readouterr()
    logs = caplog.text + captured.out + captured.err
    for secret in SECRETS:
        assert secret not in every_table_as_text(pg_url), secret
        assert files_containing(home, secret) == [], secret
        assert secret not in logs, secret
        assert secret not in cli_output, secret
    if source_port == "54x2":
        assert "postgres:***@" in logs  # the error names the URL, redacted
