"""The Celery deployment files and the executor selection, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import Definitions, job, op

from recovery_ext import (ConfigurationError, celery_executor_config, celery_settings, make_celery_app,
                          recoverable_celery_executor, with_recovery)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "celery"
BROKER, BACKEND = "redis://127.0.0.1:6379/14", "redis://127.0.0.1:6379/15"


def test_the_multi_host_instance_config_uses_the_executors_settings():
    config = yaml.safe_load((DEPLOY / "dagster.multi-host.yaml").read_text())
    launcher = config["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_celery.launcher", "CeleryRunLauncher")
    assert launcher["config"]["config_source"] == celery_settings()
    assert launcher["config"]["backend"] == {"env": "RECOVERY_CELERY_BACKEND"}
    assert "run_monitoring" not in config


def test_with_recovery_keeps_the_celery_executors_name_and_schema():
    from dagster_celery import celery_executor

    wrapped = with_recovery(celery_executor)
    assert wrapped.name == "celery"
    assert wrapped.config_schema.as_field().config_type.key == celery_executor.config_schema.as_field().config_type.key


def test_the_recoverable_celery_executor_reads_its_defaults_from_the_environment(monkeypatch):
    monkeypatch.setenv("RECOVERY_CELERY_BROKER", BROKER)
    monkeypatch.setenv("RECOVERY_CELERY_BACKEND", BACKEND)
    executor = recoverable_celery_executor()
    assert executor.name == "celery"
    fields = executor.config_schema.as_field().config_type.fields
    assert set(fields) == {"broker", "backend", "include", "config_source", "retries"}
    # read by the run worker at run time, not stored as values in the job snapshot
    assert fields["broker"].default_value == {"env": "RECOVERY_CELERY_BROKER"}
    assert fields["backend"].default_value == {"env": "RECOVERY_CELERY_BACKEND"}

    @op
    def hello():
        return 1

    @job(executor_def=executor)
    def one():
        hello()

    Definitions(jobs=[one]).get_job_def("one")   # the job validates with the wrapped executor


def test_a_missing_broker_or_an_rpc_backend_is_refused_with_the_variable_named(monkeypatch):
    monkeypatch.delenv("RECOVERY_CELERY_BROKER", raising=False)
    monkeypatch.delenv("RECOVERY_CELERY_BACKEND", raising=False)
    with pytest.raises(ValueError, match="RECOVERY_CELERY_BROKER"):
        celery_executor_config()
    with pytest.raises(ValueError, match="rpc://"):
        celery_executor_config(BROKER, "rpc://")


def test_the_workers_app_has_dagster_celerys_tasks_and_the_same_settings(monkeypatch):
    monkeypatch.setenv("RECOVERY_CELERY_BROKER", BROKER)
    monkeypatch.setenv("RECOVERY_CELERY_BACKEND", BACKEND)
    app = make_celery_app()
    assert {"execute_plan", "execute_job", "resume_job"} <= set(app.tasks)
    assert app.conf.result_backend_always_retry and app.conf.worker_disable_prefetch and not app.conf.task_acks_late
    assert app.conf.broker_url == BROKER and app.conf.result_backend == BACKEND


def test_recovery_executor_selects_the_executor_of_every_shipped_job(monkeypatch):
    from recovery_pipelines.assembly import build_definitions

    monkeypatch.setenv("RECOVERY_CELERY_BROKER", BROKER)
    monkeypatch.setenv("RECOVERY_CELERY_BACKEND", BACKEND)
    monkeypatch.setenv("RECOVERY_EXECUTOR", "celery")
    names = {j.name: j.executor_def.name for j in build_definitions().resolve_all_job_defs()}
    assert set(names.values()) == {"celery"} and "ontology_extraction" in names and "ocr_documents" in names
    monkeypatch.setenv("RECOVERY_EXECUTOR", "multiprocess")
    assert {j.executor_def.name for j in build_definitions().resolve_all_job_defs()} == {"multiprocess"}
    monkeypatch.setenv("RECOVERY_EXECUTOR", "k8s")
    with pytest.raises(ConfigurationError, match="multiprocess or celery"):
        build_definitions()
    monkeypatch.setenv("RECOVERY_EXECUTOR", "celery")
    monkeypatch.delenv("RECOVERY_CELERY_BACKEND")
    with pytest.raises(ConfigurationError, match="RECOVERY_CELERY_BACKEND"):
        build_definitions()
