"""Recovery visible on the Dagster run: outage pauses tag the run and log engine events; a takeover by
re-execution logs one too; every node reports its items in one vocabulary of metadata.

Runs in-process against a real Dagster instance (on disk) and the application tables on both databases.
"""

from __future__ import annotations

import threading

from dagster import DagsterEventType, DagsterInstance, in_process_executor

from recovery_ext import NodeContext, RecoveryResource, RetryPolicy, execute_in_process, provider_guard, \
    recoverable_job, recoverable_op
from recovery_ext._dagster.tags import TAG_PARENT_RUN, TAG_ROOT_RUN, TAG_STATE

FAST = dict(heartbeat_interval=0.5, heartbeat_timeout=10, max_retries=3, retry_initial_delay=0.01,
            retry_max_delay=0.02, outage_pause_initial=0.6, outage_pause_max=1.0)


def engine_messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [r.message for r in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)]


def watch_tags(instance: DagsterInstance, stop: threading.Event, seen: set[str]) -> threading.Thread:
    def poll():
        while not stop.is_set():
            for run in instance.get_runs():
                if TAG_STATE in run.tags:
                    seen.add(run.tags[TAG_STATE])
            stop.wait(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def run_watched(job, instance, resource):
    stop, seen = threading.Event(), set()
    watcher = watch_tags(instance, stop, seen)
    try:
        result = execute_in_process(job, instance=instance, resources={"recovery": resource})
    finally:
        stop.set()
        watcher.join(10)
    return result, seen


def test_a_node_that_pauses_on_an_outage_shows_waiting_on_its_run_then_running(db_url, tmp_path):
    calls = []

    @recoverable_op
    def flaky(ctx: NodeContext) -> int:
        calls.append(ctx.context.retry_number)
        if len(calls) <= 2:
            raise TimeoutError("the provider timed out")
        return len(calls)

    @recoverable_job(executor_def=in_process_executor)
    def outage_job():
        flaky()

    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        result, seen = run_watched(outage_job, instance, RecoveryResource(database_url=db_url, same_error_limit=1,
                                                                          **FAST))
        assert result.success and len(calls) == 3
        run = instance.get_run_by_id(result.run_id)
        assert "waiting" in seen and run.tags[TAG_STATE] == "running"
        messages = engine_messages(instance, result.run_id)
        waits = [m for m in messages if "waiting out a provider outage in flaky" in m]
        assert len(waits) == 2 and all(
            "next try at" in m and "timeout errors in a row in flaky: the provider timed out" in m for m in waits
        ), messages
        assert sum("waiting over in flaky: retry" in m for m in messages) == 2, messages
        # the metadata of the event names the next try, for the UI's event detail
        record = next(r for r in instance.all_logs(result.run_id, of_type=DagsterEventType.ENGINE_EVENT)
                      if "waiting out" in r.message)
        metadata = record.dagster_event.engine_event_data.metadata
        assert metadata["recovery_state"].value == "waiting" and metadata["next_try"].value


def test_a_guarded_provider_call_that_pauses_shows_waiting_on_its_run_then_running(db_url, tmp_path):
    answers = iter([ConnectionError("connection refused")] * 2 + ["ok"])

    def provider():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @recoverable_op
    def ask(ctx: NodeContext) -> str:
        guard = provider_guard(ctx, "http://127.0.0.1:9/v1", RetryPolicy(initial_delay=0.01, max_delay=0.02))
        return guard.call(provider)

    @recoverable_job(executor_def=in_process_executor)
    def guarded_job():
        ask()

    resource = RecoveryResource(database_url=db_url, same_error_limit=2, breaker_failure_threshold=50, **FAST)
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        result, seen = run_watched(guarded_job, instance, resource)
        assert result.success and result.output_for_node("ask") == "ok"
        assert "waiting" in seen and instance.get_run_by_id(result.run_id).tags[TAG_STATE] == "running"
        messages = engine_messages(instance, result.run_id)
        assert any("waiting out a provider outage in ask" in m and "2 connection errors in a row" in m
                   for m in messages), messages
        assert any("waiting over in ask: the pause is over" in m for m in messages), messages


def test_a_takeover_by_re_execution_is_an_event_and_shows_on_the_new_run(store, db_url, tmp_path):
    attempts = []

    @recoverable_op
    def fragile(ctx: NodeContext) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("a bug, fixed before the re-execution")
        return 1

    @recoverable_job(executor_def=in_process_executor)
    def fragile_job():
        fragile()

    resource = RecoveryResource(database_url=db_url, **FAST)
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        first = execute_in_process(fragile_job, instance=instance, resources={"recovery": resource},
                                   raise_on_error=False)
        assert not first.success
        again = execute_in_process(fragile_job, instance=instance, resources={"recovery": resource},
                                   tags={TAG_PARENT_RUN: first.run_id, TAG_ROOT_RUN: first.run_id})
        assert again.success
        (event,) = store.reports.recent_events(kinds=("pipeline_taken_over",))
        assert event["payload"]["previous_owner"] == first.run_id and event["payload"]["owner"] == again.run_id
        assert event["payload"]["cause"] == "pipeline_failed"
        assert event["payload"]["reason"] == f"re-execution of {first.run_id}"
        messages = engine_messages(instance, again.run_id)
        assert any(f"took over pipeline {event['pipeline_id']} from run {first.run_id}" in m
                   and "the pipeline had failed" in m for m in messages), messages


def test_ops_and_queue_nodes_report_items_in_one_vocabulary(db_url, tmp_path):
    @recoverable_op
    def items_node(ctx: NodeContext) -> int:
        for item in ctx.items(["a", "b", "c"]):
            (item.degrade if item.key == "c" else item.complete)(item.key)
        return 3

    @recoverable_op
    def queue_node(ctx: NodeContext, _: int) -> int:
        queue = ctx.queue("q")
        queue.enqueue([{"n": 1}, {"n": 2}], dedupe_keys=["1", "2"])
        first, second = queue.claim("w", limit=2)
        queue.complete(first, "done")
        queue.fail(second, "broken", retryable=False)
        return 1

    @recoverable_job(executor_def=in_process_executor)
    def vocabulary_job():
        queue_node(items_node())

    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        result = execute_in_process(vocabulary_job, instance=instance,
                                    resources={"recovery": RecoveryResource(database_url=db_url, **FAST)})
        metadata = {e.step_key: {k: v.value for k, v in e.event_specific_data.metadata.items()}
                    for e in result.all_events if e.event_type == DagsterEventType.STEP_OUTPUT}
    names = ("items_done", "items_resumed", "items_degraded", "items_failed", "items_dead", "items_released")
    assert {k: metadata["items_node"][k] for k in names} == dict(zip(names, (2, 0, 1, 0, 0, 0), strict=False))
    assert {k: metadata["queue_node"][k] for k in names} == dict(zip(names, (1, 0, 0, 1, 0, 0), strict=False))
