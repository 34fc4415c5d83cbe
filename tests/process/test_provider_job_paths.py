"""Provider jobs on the paths a crash or the provider can take them (SQLite and PostgreSQL), against the stand-in
of OpenAI's Batch API driven through the ``openai`` SDK:

* a kill between the provider's creating the batch and the run's recording its id: the resume finds the
  batch by its idempotency token and re-attaches (1 submission); a kill after the token was recorded but
  before the batch existed: the resume finds none and submits it, once;
* a cancelled batch and a batch whose requests partly failed: resubmitted for the unfinished items only,
  and the ledger shows each item's error and the resubmission;
* a batch wait longer than the heartbeat timeout: the pipeline stays waiting, its heartbeat goes on, and
  the orphan sensor's pass finds no orphan;
* a kill while the finished batch's results are checkpointed: the resume re-attaches, checkpoints only the
  rest, and the ledger equals the stand-in's counts.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter

import batch_kill_defs
import provider_job_runs
import pytest
from batch_checks import assert_ledger_equals_the_provider as assert_ledger_equals
from batch_checks import outcomes
from batch_defs import job
from provider_job_runs import reattached_to, start_worker
from dagster import DagsterInstance, build_sensor_context, instance_for_test
from ledger_defs import recovery_resource

from recovery_ext import execute_in_process, make_orphan_sensor, scan
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.batch_stand_in import BatchProvider
from recovery_pipelines.devserver import wait_for
import store_rows

pytestmark = pytest.mark.timeout(600)

ITEMS = 6
HEARTBEAT_TIMEOUT = 3.0  # ledger_defs.recovery_resource's


def config(**describe) -> dict:
    return {"ops": {"describe": {"config": {"items": ITEMS, "poll_seconds": 0.2, **describe}}}}


def resume(store, the_job=job, run_config=None):
    return provider_job_runs.resume(store, the_job, run_config or config())


def assert_ledger_equals_the_provider(store, pipeline_id, provider: BatchProvider):
    return assert_ledger_equals(store, pipeline_id, provider, ITEMS)


def kill_while_submitting(store, provider: BatchProvider, db_url, monkeypatch, reached, what: str):
    """Run the batch job in a worker process, kill it (-9) once ``reached()`` (the stand-in holds its answer)
    and return the submission it recorded before submitting: its token, and no id yet."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
    worker = start_worker("batch_defs", config())
    try:
        wait_for(reached, timeout=240, interval=0.05, what=what)
        (pipeline,) = store.reports.list_pipelines()
        (submitting,) = store.pipelines.provider_jobs(pipeline.id)
        assert (submitting.status, submitting.job_id) == ("submitting", None)
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.wait(30)
    provider.hold_create = provider.hold_upload = 0.0
    return submitting


def test_a_kill_before_the_batch_id_is_recorded_is_reattached_by_its_token(store, db_url, monkeypatch):
    with BatchProvider(duration=0.5, hold_create=120.0) as provider:
        # the provider created the batch; its answer (the id) is held, so the run has not recorded it
        submitting = kill_while_submitting(store, provider, db_url, monkeypatch, lambda: provider.submissions == 1,
                                           "the batch's creation")
        (batch_id,) = provider.batches
        assert provider.batches[batch_id].metadata == {"recovery_token": submitting.token}
        pipeline, result = resume(store)
        assert provider.submissions == 1  # found by its token at the provider, never submitted again
    assert reattached_to(result) == batch_id
    assert_submitted_once_and_collected(store, pipeline.id, provider, submitting.token, batch_id)


def test_a_kill_before_the_batch_exists_submits_it_once_under_the_recorded_token(store, db_url, monkeypatch):
    with BatchProvider(duration=0.5, hold_upload=120.0) as provider:
        # the token is recorded and the requests uploaded; the run dies before it creates the batch
        submitting = kill_while_submitting(store, provider, db_url, monkeypatch, lambda: provider.uploads == 1,
                                           "the requests' upload")
        assert provider.submissions == 0
        pipeline, result = resume(store)
        assert provider.submissions == 1  # the token found nothing at the provider: submitted, once
        (batch_id,) = provider.batches
    assert provider.batches[batch_id].metadata == {"recovery_token": submitting.token}
    assert reattached_to(result) is None  # nothing to re-attach to: the job was never submitted
    assert_submitted_once_and_collected(store, pipeline.id, provider, submitting.token, batch_id)


def assert_submitted_once_and_collected(store, pipeline_id, provider, token, batch_id):
    f = assert_ledger_equals_the_provider(store, pipeline_id, provider)
    assert outcomes(store, pipeline_id) == Counter({"ok": ITEMS, "submitted": 1})
    assert (f.wasted_calls, f.in_flight_unknown_calls) == (0, 0)
    jobs = store.pipelines.provider_jobs(pipeline_id)
    assert [(j.token, j.job_id, j.status, j.attempt) for j in jobs] == [(token, batch_id, "collected", 1)]
    assert len(store.pipelines.completed_items(pipeline_id, "describe")) == ITEMS


@pytest.mark.parametrize(("ending", "error", "status"), [
    ("cancel_first", "batch_cancelled", "cancelled"),   # cancelled by its owner: the rest never ran
    ("fail_first", "http_500", "collected"),            # completed, but some requests failed one by one
])
def test_a_cancelled_or_partly_failed_batch_is_resubmitted_for_its_unfinished_items_only(
        store, db_url, monkeypatch, ending, error, status):
    answered_first = 2
    with BatchProvider(duration=0.3, **{ending: answered_first}) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(job, instance=instance, run_config=config(),
                                        resources={"recovery": recovery_resource()})
        assert result.success
        assert provider.submissions == 2
        first, second = provider.batches.values()
        unfinished = [line["custom_id"] for line in first.lines[answered_first:]]
        assert [line["custom_id"] for line in second.lines] == unfinished
    (pipeline,) = store.reports.list_pipelines()
    f = assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, error: len(unfinished), "submitted": 1,
                                                    "resubmitted": 1})
    errored = [c.item_key for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == error]
    assert sorted(errored) == unfinished  # the ledger names each item the first job left unfinished
    # as the ledger counts any failed call: never checkpointed, so wasted, at no tokens (none were charged)
    assert (f.wasted_calls, f.wasted_tokens, f.in_flight_unknown_calls) == (len(unfinished), 0, 0)
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, list(j.items)) for j in jobs] == [
        (status, 1, [f"t{i:02d}" for i in range(ITEMS)]), ("collected", 2, unfinished)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def test_a_batch_wait_longer_than_the_heartbeat_timeout_is_no_orphan(store, db_url, monkeypatch):
    poll = HEARTBEAT_TIMEOUT + 1.0  # the job's status is read less often than the heartbeat must beat
    # the batch stays pending until the checks below are done, however slow the machine (the stand-in reads its
    # duration at every poll), then ends at the op's next poll
    with BatchProvider(duration=600.0) as provider, instance_for_test() as instance:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        resource = recovery_resource()
        results = []
        runner = threading.Thread(target=lambda: results.append(execute_in_process(
            job, instance=instance, run_config=config(poll_seconds=poll), resources={"recovery": resource})))
        runner.start()
        try:
            def waiting():
                found = store.reports.list_pipelines()
                return found and found[0].shown_status == WAITING and "openai-batch job" in found[0].waiting_reason

            wait_for(waiting, timeout=120, interval=0.05, what="the pipeline to show the batch wait")
            (pipeline,) = store.reports.list_pipelines()
            # the sensor's scope (its jobs, this deployment) holds the pipeline: its "0 orphans" is about it
            assert (pipeline.job_name, pipeline.deployment) == (job.name, resource.deployment_name(instance))
            sensor = make_orphan_sensor([job], minimum_interval_seconds=5)
            began, deadlines, ticks = time.monotonic(), set(), 0
            # tick the orphan sensor, as the daemon would, until the wait has lasted twice the heartbeat timeout
            while time.monotonic() - began < 2 * HEARTBEAT_TIMEOUT:
                tick = sensor.evaluate_tick(build_sensor_context(instance=instance, resources={"recovery": resource}))
                assert tick.run_requests == [] and "0 orphans" in tick.skip_message, tick.skip_message
                assert store.pipelines.get_pipeline(pipeline.id).shown_status == WAITING
                (node,) = [n for n in store.pipelines.list_nodes(pipeline.id) if n.name == "describe"]
                deadlines.add(node.heartbeat_deadline)
                ticks += 1
                time.sleep(0.2)  # a tick's pace, not a wait for a condition
            assert provider.batches[next(iter(provider.batches))].status == "in_progress"  # still pending
            stats = scan(store)  # the store's pass on its own over every job and deployment (`recovery-ext scan`)
            assert (stats.found, stats.reclaimed) == (0, 0)
            # the heartbeat went on through the wait: renewed over more than a timeout's span
            assert (max(deadlines) - min(deadlines)).total_seconds() > HEARTBEAT_TIMEOUT
        finally:
            provider.duration = 0.0
            runner.join(120)
        assert not runner.is_alive() and results and results[0].success
        assert provider.submissions == 1
    assert ticks >= 5
    done = store.pipelines.get_pipeline(pipeline.id)
    assert (done.status, done.epoch, done.resume_count) == ("completed", 1, 0)  # never taken over
    assert [(j.status, j.attempt) for j in store.pipelines.provider_jobs(pipeline.id)] == [("collected", 1)]
    assert_ledger_equals_the_provider(store, pipeline.id, provider)


def killed_mid_collection(store, provider: BatchProvider, db_url, monkeypatch, run_config, what: str):
    """Run batch_kill_defs' job in a process that kills itself (-9) after ``kill_after`` items were kept; its
    pipeline."""
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
    worker = start_worker("batch_kill_defs", run_config)
    assert worker.wait(240) == -signal.SIGKILL, f"the run should have killed itself {what}"
    (pipeline,) = store.reports.list_pipelines()
    return pipeline


def test_a_kill_while_results_are_checkpointed_resumes_with_the_rest_only(store, db_url, monkeypatch):
    kill_after = random.Random().randint(1, ITEMS - 1)
    run_config = config(kill_after=kill_after)
    with BatchProvider(duration=0.5) as provider:
        pipeline = killed_mid_collection(store, provider, db_url, monkeypatch, run_config, "mid-collection")
        assert len(store.pipelines.completed_items(pipeline.id, "describe")) == kill_after
        assert [j.status for j in store.pipelines.provider_jobs(pipeline.id)] == ["submitted"]  # not collected yet
        _, result = resume(store, batch_kill_defs.job, run_config)
        assert provider.submissions == 1
        (batch_id,) = provider.batches
    assert reattached_to(result) == batch_id
    f = assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1}), f"killed after {kill_after}"
    assert (f.wasted_calls, f.in_flight_unknown_calls) == (0, 0)
    resumed_rows = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "ok" and c.epoch == 2]
    assert len(resumed_rows) == ITEMS - kill_after  # the resume checkpointed only the rest
    assert [(j.job_id, j.status, j.attempt) for j in store.pipelines.provider_jobs(pipeline.id)] == [
        (batch_id, "collected", 1)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def test_a_kill_after_every_result_was_kept_collects_the_job_without_asking_the_provider(store, db_url, monkeypatch):
    run_config = config(kill_after=ITEMS)  # killed after the last item's checkpoint, before the job was marked
    with BatchProvider(duration=0.5) as provider:
        pipeline = killed_mid_collection(store, provider, db_url, monkeypatch, run_config, "after its last item")
        assert [j.status for j in store.pipelines.provider_jobs(pipeline.id)] == ["submitted"]
        _, result = resume(store, batch_kill_defs.job, run_config)
        assert provider.submissions == 1
        (batch_id,) = provider.batches
    assert [(j.job_id, j.status) for j in store.pipelines.provider_jobs(pipeline.id)] == [(batch_id, "collected")]
    assert [c for c in store_rows.provider_calls(store, pipeline.id) if c.epoch == 2] == []  # the resume paid nothing
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1})


def test_a_node_submits_more_batches_than_max_attempts_each_as_its_first_attempt(store, db_url, monkeypatch):
    with BatchProvider(duration=0.2) as provider:
        monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        with DagsterInstance.ephemeral() as instance:
            result = execute_in_process(batch_kill_defs.rounds_job, instance=instance,
                                        resources={"recovery": recovery_resource()})
        assert result.success
        assert provider.submissions == 4
    (pipeline,) = store.reports.list_pipelines()
    assert [(j.status, j.attempt, len(j.items)) for j in store.pipelines.provider_jobs(pipeline.id)] == [
        ("collected", 1, 2)] * 4
    assert len(store.pipelines.completed_items(pipeline.id, "describe_in_rounds")) == 8


def test_a_resume_given_a_live_batchs_items_in_two_calls_reattaches_for_both(store, db_url, monkeypatch):
    run_config = config(kill_after=1, resume_in_halves=True)
    with BatchProvider(duration=0.5) as provider:
        pipeline = killed_mid_collection(store, provider, db_url, monkeypatch, run_config, "mid-collection")
        _, result = resume(store, batch_kill_defs.job, run_config)
        assert provider.submissions == 1  # the second call re-attached too: nothing submitted or paid again
        (batch_id,) = provider.batches
    assert [(j.job_id, j.status) for j in store.pipelines.provider_jobs(pipeline.id)] == [(batch_id, "collected")]
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1})
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def cut_and_doubled(lines: list[dict]) -> list[str]:
    """The first batch's output as a provider may write it: t01's line cut off, t03's replaced by ``[]``, t02
    answered twice and an answer for an item no request named."""
    text = {line["custom_id"]: json.dumps(line) for line in lines}
    stranger = json.dumps({**lines[0], "custom_id": "zz"})
    return [text["t00"], text["t01"][:70], text["t02"], text["t02"], "[]", text["t04"], text["t05"], stranger]


def run_batch_job(store, provider, db_url, monkeypatch):
    monkeypatch.setenv("RECOVERY_DATABASE_URL", db_url)
    monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(job, instance=instance, run_config=config(),
                                    resources={"recovery": recovery_resource()}, raise_on_error=False)
    assert result.success
    (pipeline,) = store.reports.list_pipelines()
    return pipeline


def test_one_unreadable_line_of_a_batch_output_costs_only_its_own_item(store, db_url, monkeypatch):
    with BatchProvider(duration=0.3, rewrite_output=cut_and_doubled) as provider:
        pipeline = run_batch_job(store, provider, db_url, monkeypatch)
        assert provider.submissions == 2
        first, second = provider.batches.values()
        assert [line["custom_id"] for line in second.lines] == ["t01", "t03"]  # only the two it could not read
    calls = store_rows.provider_calls(store, pipeline.id)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "submitted": 1, "resubmitted": 1,
                                                    "unreadable_result": 2, "missing_result": 1,
                                                    "duplicate_result": 1, "unknown_item": 1})
    paid = [a for a in first.answered if a[0] not in ("t01", "t03")] + second.answered
    assert sorted((c.item_key, c.tokens_in, c.tokens_out) for c in calls if c.outcome == "ok") == sorted(paid)
    cut = next(c for c in calls if c.outcome == "unreadable_result" and c.item_key == "t01")
    assert first.id in cut.note and '"custom_id": "t01"' in cut.note  # the provider's words, naming the batch
    assert next(c for c in calls if c.outcome == "missing_result").item_key == "t03"
    doubled = next(c for c in calls if c.outcome == "duplicate_result")
    answered = {key: (tokens_in, tokens_out) for key, tokens_in, tokens_out in first.answered}
    assert (doubled.tokens_in, doubled.tokens_out) == answered["t02"]  # paid twice, so ledgered twice
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.status, j.attempt, len(j.items)) for j in jobs] == [("collected", 1, ITEMS), ("collected", 2, 2)]
    assert len(store.pipelines.completed_items(pipeline.id, "describe")) == ITEMS


def test_a_batch_the_provider_no_longer_knows_is_resubmitted_for_its_unfinished_items(store, db_url, monkeypatch):
    with BatchProvider(duration=0.3, forget_first=True) as provider:
        pipeline = run_batch_job(store, provider, db_url, monkeypatch)
        assert provider.submissions == 2
        first, second = provider.batches.values()
        assert first.answered == [] and len(second.lines) == ITEMS
    f = assert_ledger_equals_the_provider(store, pipeline.id, provider)
    assert outcomes(store, pipeline.id) == Counter({"ok": ITEMS, "job_gone": ITEMS, "submitted": 1,
                                                    "resubmitted": 1})
    gone = [c for c in store_rows.provider_calls(store, pipeline.id) if c.outcome == "job_gone"]
    assert all(first.id in c.note and "No batch found" in c.note for c in gone)
    assert f.in_flight_unknown_calls == 0
    jobs = store.pipelines.provider_jobs(pipeline.id)
    assert [(j.job_id, j.status, j.attempt) for j in jobs] == [(first.id, "expired", 1), (second.id, "collected", 2)]
