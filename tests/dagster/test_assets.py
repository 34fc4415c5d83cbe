"""Recoverable assets and Dagster-native signatures, in-process against a real instance and store:
Config classes and typed resources reach the body, RetryPolicy composes with the classifier,
materializations carry the user's and the recovery metadata, partitions are separate pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    execute_job,
)

from dagster._core.definitions.reconstruct import ReconstructableRepository

import asset_defs
from recovery_ext import RecoveryResource, execute_in_process


@pytest.fixture
def defs(db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    asset_defs.SEEN.clear()
    return asset_defs.definitions()



def materializations(instance, key: str):
    return [r.asset_materialization for r in instance.fetch_materializations(AssetKey(key), limit=100).records]


def step_events(result, event_type):
    return [e for e in result.all_events if e.event_type == event_type]


def test_config_class_and_typed_resource_reach_an_asset_body_and_metadata_lands_on_materializations(
        defs, instance, store):
    result = execute_in_process(defs.resolve_job_def("words_job"), instance=instance,
                                run_config={"ops": {"words": {"config": {"word": "hi", "items": 2}}}})
    assert result.success
    (seen,) = [s for s in asset_defs.SEEN if s.get("asset") == "words"]
    assert isinstance(seen["config"], asset_defs.Greeting) and seen["config"].word == "hi"
    assert isinstance(seen["counter"], asset_defs.Counter) and seen["counter"].start == 7
    (words,) = materializations(instance, "words")
    assert words.metadata["items_done"].value == 2 and words.metadata["items_resumed"].value == 0
    assert words.metadata["recovery"].value == f"completed in run {result.run_id}"
    assert words.metadata["attempts"].value == 1
    (report,) = materializations(instance, "word_report")  # the user's MaterializeResult metadata and ours
    assert report.metadata["words_seen"].value == 2 and report.metadata["first"].value == "hi-0"
    assert report.metadata["recovery"].value == f"completed in run {result.run_id}"
    (left,), (right,) = materializations(instance, "left"), materializations(instance, "right")
    assert left.metadata["side"].value == "left" and "side" not in right.metadata
    assert left.metadata["items_done"].value == right.metadata["items_done"].value == 2
    assert result.asset_value("left") == ["hi-0"] and result.asset_value("right") == ["hi-1"]
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "completed"
    assert {n.name: n.status for n in store.pipelines.list_nodes(pipeline.id)} == {
        "words": "completed", "word_report": "completed", "pair": "completed"}


def test_config_class_typed_resource_and_output_metadata_of_an_op(defs, instance):
    result = execute_in_process(defs.resolve_job_def("typed_job"), instance=instance,
                                run_config={"ops": {"typed_op": {"config": {"word": "yo"}}}})
    assert result.success
    (seen,) = [s for s in asset_defs.SEEN if s.get("op") == "typed_op"]
    assert seen["config"].word == "yo" and seen["counter"].start == 7
    assert result.output_for_node("doubled") == 14
    (output,) = [e for e in step_events(result, DagsterEventType.STEP_OUTPUT) if e.step_key == "typed_op"]
    metadata = output.event_specific_data.metadata
    assert metadata["custom"].value == "yes" and metadata["recovery"].value == f"completed in run {result.run_id}"


def run_end_messages(instance, run_id: str) -> list[str]:
    """What the run worker logged about its pipeline as the run ended."""
    return [e.user_message for e in instance.all_logs(run_id) if e.user_message.startswith("recovery-ext: pipeline ")
            and " provider calls: " not in e.user_message]


def test_a_finished_asset_is_not_run_again_in_its_pipeline_nor_materialized_twice(defs, instance, store):
    """A full re-execution of a failed run takes its pipeline over: the finished asset's step does
    not run (no item redone, no second materialization) and downstream gets the value its IO
    manager stored."""
    from dagster import ReexecutionOptions

    repository = ReconstructableRepository.for_module("asset_defs", "defs",
                                                      working_directory=str(Path(asset_defs.__file__).parent))
    job = repository.get_reconstructable_job("words_job")
    config = {"ops": {"words": {"config": {"word": "re", "items": 2}}}}
    with execute_job(job, instance=instance, run_config={**config, "ops": {
            **config["ops"], "word_report": {"config": {"fail": True}}}}, raise_on_error=False) as first:
        assert not first.success
        first_id = first.run_id
    (pipeline,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(pipeline.id).status == "failed"
    # its step failed the pipeline for good: the run's end says so, not that the pipeline was "already" failed
    assert run_end_messages(instance, first_id) == [
        f"recovery-ext: pipeline {pipeline.id} failed: {store.pipelines.get_pipeline(pipeline.id).error}"]
    asset_defs.SEEN.clear()
    # in-process re-execution leaves out the tags the UI's re-execution carries: set them as it does
    parent = {"dagster/parent_run_id": first_id, "dagster/root_run_id": first_id}
    with execute_job(job, instance=instance, run_config=config, tags=parent, reexecution_options=ReexecutionOptions(
            parent_run_id=first_id, step_selection=["words", "word_report", "pair"])) as second:
        assert second.success
        second_id = second.run_id
    assert not [s for s in asset_defs.SEEN if "item" in s]  # nothing recomputed
    assert store.pipelines.get_pipeline(pipeline.id).status == "completed" and len(store.reports.list_pipelines()) == 1
    assert run_end_messages(instance, second_id) == [f"recovery-ext: pipeline {pipeline.id} completed"]
    (words,) = materializations(instance, "words")
    assert words.metadata["recovery"].value == f"completed in run {first_id}"
    started = {e.step_key for e in instance.all_logs(second_id, of_type=DagsterEventType.STEP_START)}
    assert started == {"word_report"}  # the finished assets' steps (words, the multi-asset pair) did not run
    assert len(materializations(instance, "left")) == len(materializations(instance, "right")) == 1
    (report,) = materializations(instance, "word_report")
    assert report.metadata["words_seen"].value == 2 and report.metadata["recovery"].value.endswith(second_id)


def test_retry_policy_and_a_permanent_error_mean_no_retry(defs, instance, store):
    result = execute_in_process(defs.resolve_job_def("flaky_job"), instance=instance, raise_on_error=False)
    assert not result.success
    assert [s["retry"] for s in asset_defs.SEEN if s.get("asset") == "flaky"] == [0]
    assert not step_events(result, DagsterEventType.STEP_UP_FOR_RETRY)
    (failure,) = step_events(result, DagsterEventType.STEP_FAILURE)
    assert failure.step_failure_data.user_failure_data.metadata["category"].value == "client_error" or \
        "400" in failure.step_failure_data.user_failure_data.description
    (pipeline,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(pipeline.id).status == "failed"


@pytest.mark.timeout(120)
def test_retry_policy_sets_the_retries_of_a_transient_error(db_url, monkeypatch, instance):
    """3 quick retries as the policy says (the resource alone: 1 retry after 30 s), then the outage
    handling of every recoverable node (pauses, here a tiny budget that gives up)."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    asset_defs.SEEN.clear()
    recovery = RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=5.0, max_retries=1,
                                retry_initial_delay=30.0, retry_max_delay=60.0, same_error_limit=20,
                                outage_pause_initial=0.05, outage_pause_max=0.1, outage_budget_seconds=0.3)
    defs = asset_defs.definitions(failing=asset_defs.Failing(status=503), recovery=recovery)
    result = execute_in_process(defs.resolve_job_def("flaky_job"), instance=instance, raise_on_error=False)
    assert not result.success
    retries = step_events(result, DagsterEventType.STEP_UP_FOR_RETRY)
    assert [s["retry"] for s in asset_defs.SEEN if s.get("asset") == "flaky"][:4] == [0, 1, 2, 3]
    assert all(e.event_specific_data.seconds_to_wait < 1.0 for e in retries[:3])
    (failure,) = step_events(result, DagsterEventType.STEP_FAILURE)
    assert "outage budget" in failure.step_failure_data.user_failure_data.description


def test_the_implicit_asset_job_runs_under_the_definitions_executor(db_url, monkeypatch, instance, store):
    """What the daemon's asset backfills run: the implicit job, executor from Definitions(executor=...)."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    repository = ReconstructableRepository.for_module("asset_defs", "defs",
                                                      working_directory=str(Path(asset_defs.__file__).parent))
    job = repository.get_reconstructable_job("__ASSET_JOB")
    with execute_job(job.get_subset(asset_selection={AssetKey("words"), AssetKey("word_report")}),
                     instance=instance) as result:
        assert result.success
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "completed" and pipeline.job_name == "__ASSET_JOB"
    assert sorted(n.name for n in store.pipelines.list_nodes(pipeline.id)) == ["word_report", "words"]
    (words,) = materializations(instance, "words")
    assert words.metadata["items_done"].value == 3


def test_a_resume_of_a_single_run_backfill_keeps_its_partition_range(defs, instance, store):
    from dagster import DagsterRun

    from recovery_ext._dagster.resume_runs import PARTITION_RANGE_TAGS, resume_request
    from recovery_ext._store.models import Reclaimed

    start, end = PARTITION_RANGE_TAGS
    job = defs.resolve_job_def("ranged_job")
    origin = DagsterRun(job_name="ranged_job", run_id="origin-run",
                        tags={start: "b", end: "c", "dagster/backfill": "bf"})
    reclaimed = Reclaimed(pipeline_id=1, job_name="ranged_job", params={}, previous_owner="origin-run", owner=None,
                          epoch=2, resume_number=1, origin_run_id="origin-run")
    request = resume_request(reclaimed, origin, job)
    assert (request.tags[start], request.tags[end]) == ("b", "c") and "dagster/backfill" not in request.tags
    # what the resume run executes (without the tags that attach it to the reclaimed pipeline)
    tags = {k: v for k, v in request.tags.items() if not k.startswith("recovery/")}
    result = execute_in_process(job, instance=instance, tags=tags)
    assert result.success
    (materialized,) = {m.metadata["keys"].value for m in materializations(instance, "ranged")}
    assert materialized == "b,c"
    assert sorted(m.partition for m in materializations(instance, "ranged")) == ["b", "c"]


def test_the_docs_asset_example_runs_as_written(db_url, monkeypatch, instance, store, tmp_path):
    import importlib.util
    import re

    section = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "assets.md").read_text()
    (tmp_path / "my_assets.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    spec = importlib.util.spec_from_file_location("my_assets", tmp_path / "my_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)  # RecoveryResource() reads it
    result = execute_in_process(module.defs.resolve_job_def("summaries_job"), instance=instance,
                                partition_key="batch-1")
    assert result.success
    assert result.asset_value("summaries") == {
        f"batch-1/doc-{i}": f"summary of batch-1/doc-{i}" for i in range(4)}
    (stats,) = materializations(instance, "summary_stats")
    assert stats.partition == "batch-1" and stats.metadata["documents"].value == 4
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "completed"


def test_the_asset_orphan_sensor_resumes_an_asset_backfill_run_with_its_selection_and_partition(
        db_url, monkeypatch, store):
    """A dead run of the implicit asset job (what an asset backfill launches): the orphan sensor for
    ``ASSET_JOB`` requests its resume with the run's asset selection and partition key, and Dagster
    resolves that request against the implicit job (partition tags from the selected assets)."""
    from dagster import DagsterRunStatus, build_sensor_context
    from dagster import instance_for_test
    from dagster._core.test_utils import create_run_for_test

    from helpers import expire
    from recovery_ext import ASSET_JOB, make_orphan_sensor
    from recovery_ext._dagster.tags import TAG_PIPELINE, TAG_RESUME_NUMBER

    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    sensor = make_orphan_sensor([ASSET_JOB], minimum_interval_seconds=1)
    assert sensor.name == "recovery_asset_orphan_sensor"
    repository = asset_defs.definitions(recovery=asset_defs.recovery_resource()).get_repository_def()
    with instance_for_test() as instance:
        dead = create_run_for_test(instance, job_name=ASSET_JOB, status=DagsterRunStatus.FAILURE,
                                   asset_selection={AssetKey("ranged")},
                                   tags={"dagster/partition": "b", "dagster/backfill": "bf", "team": "ocr"})
        own = store.pipelines.create_pipeline(
            ASSET_JOB, ["ranged"], owner=dead.run_id, origin_run_id=dead.run_id, params={}
        )
        store.pipelines.start_node(own, "ranged")
        expire(store, own.pipeline_id)
        context = build_sensor_context(instance=instance, repository_def=repository,
                                       resources={"recovery": RecoveryResource(database_url=db_url)})
        (request,) = sensor.evaluate_tick(context).run_requests
    assert request.job_name == ASSET_JOB and request.asset_selection == [AssetKey("ranged")]
    assert request.partition_key == "b" and request.tags["dagster/partition"] == "b"
    assert request.tags["team"] == "ocr" and "dagster/backfill" not in request.tags
    assert (request.tags[TAG_PIPELINE], request.tags[TAG_RESUME_NUMBER]) == (str(own.pipeline_id), "1")


def test_one_orphan_sensor_targets_job_definitions_or_the_implicit_asset_job():
    from recovery_ext import ASSET_JOB, make_orphan_sensor

    with pytest.raises(ValueError, match="another for the jobs"):
        make_orphan_sensor([ASSET_JOB, asset_defs.typed_job])
