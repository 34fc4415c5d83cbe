"""The library's sensors: no Beta warnings from Dagster, the 5 s floor stated at load, one queue run at a time."""

from __future__ import annotations

import warnings

import pytest
from dagster import (
    BetaWarning,
    DagsterRunStatus,
    Definitions,
    build_sensor_context,
    in_process_executor,
    instance_for_test,
)
from dagster._core.test_utils import create_run_for_test

from recovery_ext import (
    ConfigurationError,
    RecoveryResource,
    make_orphan_sensor,
    make_stuck_item_sensor,
    recoverable_job,
    recoverable_op,
)
from recovery_ext._dagster.recoverable import TAG_PIPELINE, TAG_RESUME_NUMBER
from recovery_ext._dagster.sensors import TAG_QUEUE
from recovery_pipelines.assembly import build_definitions
from recovery_pipelines.ocr import make_ocr_job
import store_rows


@recoverable_op(required_resource_keys={"source"})
def read(ctx) -> int:
    return 1


@recoverable_job(executor_def=in_process_executor)
def needs_a_resource():  # a job whose resources Definitions binds: what made Dagster copy the sensors
    read()


def test_loading_definitions_with_the_librarys_sensors_raises_no_beta_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        defs = Definitions(jobs=[needs_a_resource],
                           sensors=[make_orphan_sensor([needs_a_resource]),
                                    make_stuck_item_sensor(needs_a_resource, "q")],
                           resources={"recovery": RecoveryResource(), "source": 1})
        Definitions.validate_loadable(defs)
        sensors = {s.name: s for s in defs.get_repository_def().sensor_defs}
    assert [str(w.message) for w in caught if issubclass(w.category, BetaWarning)] == []
    # the copies Dagster made, bound to the resource-bound job, still target it
    assert sensors["recovery_orphan_sensor"].job_name == "needs_a_resource"


def test_the_shipped_definitions_load_without_a_beta_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("RECOVERY_DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RECOVERY_SENSOR_INTERVAL", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Definitions.validate_loadable(build_definitions(prepare_inputs=True))
    assert [str(w.message) for w in caught if issubclass(w.category, BetaWarning)] == []


def test_a_sensor_interval_under_dagsters_5_s_floor_is_warned_at_load():
    with pytest.warns(UserWarning, match=r"evaluates a sensor at most every 5 s, so recovery_orphan_sensor ticks "
                                         r"every 5 s, not 1 s"):
        make_orphan_sensor([needs_a_resource], minimum_interval_seconds=1)
    with pytest.warns(UserWarning, match="recovery_stuck_items_q ticks every 5 s, not 2 s"):
        make_stuck_item_sensor(needs_a_resource, "q", minimum_interval_seconds=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_orphan_sensor([needs_a_resource], minimum_interval_seconds=5)


def test_the_demo_refuses_a_sensor_interval_under_the_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("RECOVERY_DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.setenv("RECOVERY_SENSOR_INTERVAL", "1")
    with pytest.raises(ConfigurationError, match="RECOVERY_SENSOR_INTERVAL must be at least 5 s, got 1"):
        build_definitions()


def test_the_stuck_item_sensor_launches_no_queue_run_beside_a_resume_of_a_launchpad_run(store, db_url):
    """A Launchpad run carries no queue tag, nor does its resume run: it drains the queue all the same."""
    store.queue.enqueue("ocr", [{"n": 1}], max_attempts=3)
    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", stale_after_seconds=600, run_config={"ops": {}})
    with instance_for_test() as instance:
        def tick():
            context = build_sensor_context(instance=instance,
                                           resources={"recovery": RecoveryResource(database_url=db_url)})
            return sensor.evaluate_tick(context)

        other = create_run_for_test(instance, job_name="ocr_documents", status=DagsterRunStatus.STARTED,
                                    tags={TAG_QUEUE: "another"})
        (request,) = tick().run_requests  # a run draining another queue does not count
        resume = create_run_for_test(instance, job_name="ocr_documents", status=DagsterRunStatus.NOT_STARTED,
                                     tags={TAG_PIPELINE: "7", TAG_RESUME_NUMBER: "1"})
        result = tick()
        assert result.run_requests == [] and f"run {resume.run_id} is draining it" in result.skip_message
        assert other.run_id not in result.skip_message and request.tags[TAG_QUEUE] == "ocr"


def test_the_stuck_item_sensor_leaves_a_crashed_pipelines_queue_to_its_resume_run(store, db_url):
    """Between a killed run's FAILURE and its resume run (the orphan sensor's next tick) no run of the job
    is active, yet its pipeline is running: a queue run launched then would race the resume run."""
    own = store.pipelines.create_pipeline("ocr_documents", ["enqueue_documents", "ocr_documents"], owner="dead-run",
                                origin_run_id="dead-run")
    store.queue.enqueue("ocr", [{"n": 1}, {"n": 2}], max_attempts=3, own=own)
    sensor = make_stuck_item_sensor(make_ocr_job(), "ocr", stale_after_seconds=600, run_config={"ops": {}})
    with instance_for_test() as instance:
        create_run_for_test(instance, job_name="ocr_documents", status=DagsterRunStatus.FAILURE)
        context = build_sensor_context(instance=instance, resources={"recovery": RecoveryResource(database_url=db_url)})
        result = sensor.evaluate_tick(context)
        assert result.run_requests == []
        assert f"pipeline {own.pipeline_id} of ocr_documents is running or awaits its resume run" in result.skip_message
        store_rows.fail_pipeline(store, own.pipeline_id, "given up by the operator")  # nobody will drain it now
        (request,) = sensor.evaluate_tick(context).run_requests
        assert request.tags[TAG_QUEUE] == "ocr"
