"""The shipped dagster.yaml examples load, and the PostgreSQL one stores runs with its driver choice."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from dagster import DagsterInstance, DagsterRunStatus

from databases import create_pg_database, drop_pg_database
from e2e_defs import items_job_inprocess
from recovery_ext import RecoveryResource, execute_in_process

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def run_with_instance(home: Path, app_url: str):
    with DagsterInstance.from_config(str(home)) as instance:
        cfg = {"ops": {n: {"config": {"items": 1, "item_seconds": 0.0}} for n in ("n1", "n2", "n3", "n4")}}
        result = execute_in_process(items_job_inprocess, run_config=cfg, instance=instance,
                                    resources={"recovery": RecoveryResource(database_url=app_url)})
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        assert run.status == DagsterRunStatus.SUCCESS
        return type(instance.run_storage).__name__


def test_sqlite_instance_example(tmp_path):
    shutil.copy(DEPLOY / "dagster.sqlite.yaml", tmp_path / "dagster.yaml")
    assert yaml.safe_load((tmp_path / "dagster.yaml").read_text())["sensors"]["use_threads"] is True
    assert run_with_instance(tmp_path, f"sqlite:///{tmp_path / 'app.sqlite3'}") == "SqliteRunStorage"


def test_postgres_instance_example_with_psycopg2(tmp_path, pg_admin, monkeypatch):
    dagster_db = create_pg_database(pg_admin)
    app_db = create_pg_database(pg_admin)
    try:
        monkeypatch.setenv("DAGSTER_PG_URL", dagster_db.replace("postgresql://", "postgresql+psycopg2://"))
        shutil.copy(DEPLOY / "dagster.postgres.yaml", tmp_path / "dagster.yaml")
        assert run_with_instance(tmp_path, app_db) == "PostgresRunStorage"
    finally:
        drop_pg_database(pg_admin, dagster_db)
        drop_pg_database(pg_admin, app_db)
