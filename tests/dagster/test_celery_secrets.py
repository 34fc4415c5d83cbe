"""The Celery broker's and backend's passwords are read by the run worker when the run starts: they are in no
job snapshot, no run config and no Launchpad default."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, Definitions, job, op
from dagster._config import process_config
from dagster._serdes import serialize_value

from recovery_ext import ConfigurationError, recoverable_celery_executor

PASSWORD = "br0kerS3cretPw"
BROKER = f"redis://:{PASSWORD}@127.0.0.1:6379/14"
BACKEND = f"redis://default:{PASSWORD}@127.0.0.1:6379/15"


@op
def hello():
    return 1


def test_no_celery_password_is_in_the_job_snapshot_or_the_run_config(monkeypatch):
    monkeypatch.setenv("RECOVERY_CELERY_BROKER", BROKER)
    monkeypatch.setenv("RECOVERY_CELERY_BACKEND", BACKEND)
    executor = recoverable_celery_executor()

    @job(executor_def=executor)
    def one():
        hello()

    resolved = Definitions(jobs=[one]).get_job_def("one")
    snapshot = serialize_value(resolved.get_job_snapshot())
    assert PASSWORD not in snapshot and "RECOVERY_CELERY_BROKER" in snapshot
    with DagsterInstance.ephemeral() as instance:
        run = instance.create_run_for_job(resolved, run_config={})
        stored = serialize_value(instance.get_run_by_id(run.run_id)) + serialize_value(
            instance.get_job_snapshot(run.job_snapshot_id))
    assert PASSWORD not in stored
    # The run worker resolves the variables when it builds the executor.
    config = process_config(executor.config_schema.config_type, {})
    assert config.success and config.value["broker"] == BROKER and config.value["backend"] == BACKEND


def test_a_celery_url_with_a_password_given_as_text_is_refused(monkeypatch):
    with pytest.raises(ConfigurationError, match=r"pass it as \{'env': 'VARIABLE'\}") as info:
        recoverable_celery_executor({"broker": BROKER, "backend": {"env": "X"}, "config_source": {}})
    assert PASSWORD not in str(info.value)
    named = recoverable_celery_executor({"broker": {"env": "MY_BROKER"}, "backend": "redis://127.0.0.1:6379/1",
                                         "config_source": {}})
    assert named.config_schema.as_field().config_type.fields["broker"].default_value == {"env": "MY_BROKER"}
