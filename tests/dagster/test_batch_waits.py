"""A step waiting on a provider job shows as waiting on THAT job, apart from outages: on the Dagster run (an
engine event naming the job, its next check agreeing with the pipeline row's), in `recovery-ext status`, and a
run that stops waiting before the job ends never says the job finished. The crash demo's batch job against the
stand-in of OpenAI's Batch API (the ``openai`` SDK), in process, on both databases."""

from __future__ import annotations

import datetime as dt
import json
import threading

from click.testing import CliRunner
from dagster import DagsterEventType, DagsterInstance

from batch_defs import job
from helpers import reclaim_until_taken
from recovery_ext import RecoveryResource, execute_in_process
from recovery_ext._cli import main
from recovery_ext._store.models import PassPlan
from recovery_ext._store.statuses import WAITING
from recovery_pipelines.batch_stand_in import BatchProvider
from recovery_pipelines.devserver import wait_for

POLL = 2.0  # the next check's distance: an event whose "in N s" disagreed with its time would be 2 s off


def _config(poll: float = POLL) -> dict:
    return {"ops": {"describe": {"config": {"items": 3, "poll_seconds": poll}}}}


def _engine_events(instance, run_id):
    return [r for r in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)]


def _run_in_thread(instance, db_url, results):
    resource = RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=10)
    thread = threading.Thread(target=lambda: results.append(execute_in_process(
        job, instance=instance, run_config=_config(), resources={"recovery": resource}, raise_on_error=False)))
    thread.start()
    return thread


def _waiting_on_the_batch(store):
    found = store.reports.list_pipelines()
    return bool(found) and found[0].shown_status == WAITING and found[0].waiting_reason.startswith("provider job")


def test_a_pending_batch_shows_as_waiting_on_that_job_with_one_next_check(store, db_url, monkeypatch, tmp_path):
    results: list = []
    # the batch runs until the status commands have seen the wait (however slow the machine), then ends at
    # the op's next poll: the stand-in reads its duration at every poll
    with BatchProvider(duration=600.0) as provider, DagsterInstance.local_temp(str(tmp_path)) as instance:
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        runner = _run_in_thread(instance, db_url, results)
        try:
            wait_for(lambda: _waiting_on_the_batch(store), timeout=60, interval=0.05, what="the batch wait")
            status = CliRunner().invoke(main, ["--database-url", db_url, "status"]).output
            statuses = CliRunner().invoke(main, ["--database-url", db_url, "--json", "status"]).output
        finally:
            provider.duration = 0.0
            runner.join(60)
        (batch_id,) = provider.batches
    assert results and results[0].success
    # listed under the job, not under an outage
    assert "Waiting on a provider outage: 0" in status and "Waiting on a provider job (batch, async OCR): 1" in status
    assert f"openai-batch job {batch_id} (3 items)" in status and "next check" in status
    assert '"waiting_on": "provider job"' in statuses
    events = _engine_events(instance, results[0].run_id)
    (wait,) = [e for e in events if "waiting on a provider job in describe" in e.message]
    assert f"openai-batch job {batch_id}" in wait.message and "waiting out a provider outage" not in wait.message
    metadata = {k: v.value for k, v in wait.dagster_event.engine_event_data.metadata.items()}
    assert (metadata["waiting_on"], metadata["job_id"], metadata["provider"]) == ("provider job", batch_id,
                                                                                  "openai-batch")
    # "next check at T (in N s)": T is N s after the event, as the pipeline row's next check was

    next_check = dt.datetime.fromisoformat(metadata["next_check"])
    said = float(metadata["wait_seconds"])
    assert said == POLL and f"(in {POLL:.1f} s)" in wait.message
    distance = (next_check - dt.datetime.fromtimestamp(wait.timestamp, dt.UTC)).total_seconds()
    assert abs(distance - said) < POLL / 2, (distance, said)
    (over,) = [e.message for e in events if "waiting over in describe" in e.message]
    assert f"openai-batch job {batch_id} ended: completed" in over
    pipeline_id = store.reports.list_pipelines()[0].id
    transitions = [t["event"] for t in store.reports.transitions_for(pipeline_id=pipeline_id)]
    assert "provider_job_wait" in transitions and "outage_pause" not in transitions
    # the report counts the wait as the job's, not an outage's
    report = json.loads(CliRunner().invoke(main, ["--database-url", db_url, "--json", "report",
                                              str(pipeline_id)]).output)
    assert set(report["waited_on"]) == {"provider job"} and report["waited_on"]["provider job"] > 0


def test_a_run_that_stops_waiting_before_the_batch_ends_never_says_it_finished(store, db_url, monkeypatch, tmp_path):
    results: list = []
    with BatchProvider(duration=60.0) as provider, DagsterInstance.local_temp(str(tmp_path)) as instance:
        monkeypatch.setenv("RECOVERY_BATCH_URL", provider.url)
        runner = _run_in_thread(instance, db_url, results)
        try:
            wait_for(lambda: _waiting_on_the_batch(store), timeout=60, interval=0.05, what="the batch wait")
            (pipeline,) = store.reports.list_pipelines()
            reclaim_until_taken(store, PassPlan(dead_owner_runs=[pipeline.owner]))  # taken over, as after a crash
        finally:
            runner.join(60)
        (batch,) = provider.batches.values()
        assert batch.status == "in_progress"  # the batch is still pending at the provider
    assert results and not results[0].success
    messages = [e.message for e in _engine_events(instance, results[0].run_id)]
    assert any("stopped waiting on openai-batch job" in m and "still running at the provider" in m
               for m in messages), messages
    assert not any("finished" in m or "ended:" in m for m in messages if "openai-batch" in m), messages
