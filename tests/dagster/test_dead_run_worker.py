"""A step process whose run worker died before the step began (it took seconds to start on a busy machine) does not
start its step: no node row moves to running, no body runs, and the step fails with one plain line, no chained
traceback of our own. The resume does the node."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
from dagster import DagsterEventType, Field, in_process_executor, job
from sqlalchemy import inspect

from e2e_defs import calls, items_job_inprocess
from recovery_pipelines.devserver import wait_for
from sdk_stand_in import SdkStandIn
from recovery_ext import (ClassifiedError, LLMResource, RecoveryResource, execute_in_process, recoverable_op,
                          with_recovery)
from recovery_ext._dagster import executor, recoverable
from recovery_ext._liveness import heartbeat as parent
from recovery_ext._liveness.heartbeat import RUN_WORKER_PID_ENV


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def run_items_job(db_url):
    return execute_in_process(items_job_inprocess, raise_on_error=False, run_config={"ops": {
        n: {"config": {"items": 2, "item_seconds": 0.0}} for n in ("n1", "n2", "n3", "n4")}},
        resources={"recovery": RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=3)})


def test_a_step_whose_run_worker_is_already_dead_does_not_start(store, db_url, monkeypatch):
    # The ops run in this process as a step process runs them: not the run worker, which is another process,
    # named in the environment as run workers name themselves to their step processes, and dead.
    monkeypatch.setattr(recoverable, "is_run_worker", lambda run_id: False)
    monkeypatch.setattr(executor, "mark_run_worker", lambda: None)
    monkeypatch.setenv(RUN_WORKER_PID_ENV, str(dead_pid()))
    result = run_items_job(db_url)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert failure.step_key == "n1"
    error = failure.event_specific_data.error
    assert "its run worker" in error.message and "not started" in error.message
    assert error.cause is None  # one plain failure, no chained exception of ours
    (p,) = store.reports.list_pipelines()
    assert [n.status for n in store.pipelines.list_nodes(p.id)] == ["pending"] * 4  # never started
    with store.read() as conn:  # no body ran: the job's call record was never even created
        assert not inspect(conn).has_table(calls.name)


def test_a_step_whose_run_worker_dies_mid_way_fails_with_one_plain_line(store, db_url, monkeypatch):
    """The expected end of a step that outlived its run worker: a failure that says so, without the chained
    traceback of the StopRequested that stopped it."""
    monkeypatch.setattr(recoverable, "is_run_worker", lambda run_id: False)
    parent.RUN_WORKER_GONE.set()  # what the watch thread sets once the run worker died
    try:
        result = run_items_job(db_url)
    finally:
        parent.RUN_WORKER_GONE.clear()
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = failure.event_specific_data.error
    assert "the run worker died" in error.message and error.cause is None


@recoverable_op
def wraps_the_stop(ctx):
    try:  # an SDK wraps its transport's error in its own: here, the stop its client's check raised
        for item in ctx.items(["a", "b"]):
            ctx.check_calls()  # what a provider client asks before each request
            item.complete(item.key)
    except Exception as exc:
        raise ConnectionError("the SDK's connection error") from exc


@job(executor_def=with_recovery(in_process_executor))
def wrapping_job():
    wraps_the_stop()


def failure_in_a_step_process(job_def, db_url, monkeypatch, *, gone: bool, run_config=None, resources=None,
                              **settings):
    """The step failure of ``job_def``'s one op, run as a step process runs it (not its run worker); ``gone``: its
    run worker died before the op began (else the op says when); ``settings``: the resource's, overridden;
    ``resources``: the op's others."""
    monkeypatch.setattr(recoverable, "is_run_worker", lambda run_id: False)
    if gone:
        parent.RUN_WORKER_GONE.set()  # what the watch thread sets once the run worker died
    try:
        result = execute_in_process(job_def, raise_on_error=False, run_config=run_config, resources={
            **(resources or {}), "recovery": RecoveryResource(**{"database_url": db_url, "heartbeat_interval": 0.5,
                                                                "heartbeat_timeout": 3, **settings})})
    finally:
        parent.RUN_WORKER_GONE.clear()
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    return failure.event_specific_data.error


def test_a_stop_a_client_library_wrapped_says_the_run_worker_died_too(store, db_url, monkeypatch):
    error = failure_in_a_step_process(wrapping_job, db_url, monkeypatch, gone=True)
    assert "the run worker died" in error.message and error.cause is None
    assert store.pipelines.completed_items(store.reports.list_pipelines()[0].id, "wraps_the_stop") == {}


@recoverable_op
async def asks_in_a_task_group(ctx):
    """Its requests in one asyncio.TaskGroup, which raises what its tasks raised as one ExceptionGroup."""
    async def ask(key):
        ctx.check_calls()  # what a provider client asks before each request
        return key

    async with asyncio.TaskGroup() as group:
        for key in ("a", "b"):
            group.create_task(ask(key))


@job(executor_def=with_recovery(in_process_executor))
def task_group_job():
    asks_in_a_task_group()


def test_a_stop_inside_a_task_group_s_exception_group_leaves_the_pipeline_to_recovery(store, db_url, monkeypatch):
    """Before: the stop, one member of ``ExceptionGroup([StopRequested, StopRequested])``, was not seen as a stop;
    the group was classified permanent and the node failed for good, the pipeline with it. Now it is a stop: the
    step fails with one plain line and the node stays running, for the orphan sensor to resume."""
    error = failure_in_a_step_process(task_group_job, db_url, monkeypatch, gone=True)
    assert "the run worker died" in error.message and error.cause is None
    (p,) = store.reports.list_pipelines()
    assert store.pipelines.get_pipeline(p.id).status == "running"
    assert store.pipelines.get_node(p.id, "asks_in_a_task_group").status == "running"


IN_FLIGHT = 4


@recoverable_op(config_schema={"first_never_answered": Field(bool, default_value=False)})
async def answers_in_flight(ctx):
    """Four requests in flight, the 4th sent as the run worker dies; each answered a little after the last (the
    first never, with ``first_never_answered``: a client with no timeout)."""
    sent = []

    async def ask(item):
        sent.append(item.key)
        if len(sent) == IN_FLIGHT:
            parent.RUN_WORKER_GONE.set()  # what the watch thread sets once the run worker died
        if len(sent) == 1 and ctx.context.op_config["first_never_answered"]:
            await asyncio.Event().wait()
        await asyncio.sleep(0.2 * len(sent))  # the request on its way: answered after the death, one by one
        return f"answer {item.key}"

    await ctx.amap(ask, [f"k{i}" for i in range(3 * IN_FLIGHT)], concurrency=IN_FLIGHT)


@job(executor_def=with_recovery(in_process_executor))
def in_flight_job():
    answers_in_flight()


def test_a_step_whose_run_worker_dies_keeps_the_answers_of_the_tasks_in_flight_and_sends_nothing_new(
        store, db_url, monkeypatch):
    """A new user's trial: a step process of an `amap` outlived its killed run worker by 2 s; its 31 requests in
    flight were answered within 0.5 s, but the tasks had been cancelled, so the resume paid for all 31 again. The
    pipeline is still this worker's (no take-over yet): the answers are kept, and nothing new is sent."""
    error = failure_in_a_step_process(in_flight_job, db_url, monkeypatch, gone=False)
    assert "the run worker died" in error.message
    (pipeline,) = store.reports.list_pipelines()
    # the four in flight answered and checkpointed; none of the other eight started
    assert store.pipelines.completed_items(pipeline.id, "answers_in_flight") == {
        f"k{i}": f"answer k{i}" for i in range(IN_FLIGHT)}


@pytest.mark.timeout(180)
def test_a_request_never_answered_after_the_run_worker_died_is_given_up_after_one_heartbeat_timeout(
        store, db_url, monkeypatch):
    """A review: the wait for the requests in flight had no bound, so one request without a timeout kept the
    orphaned step process alive for good. It is cancelled once a heartbeat timeout (3 s here) has passed."""
    error = failure_in_a_step_process(in_flight_job, db_url, monkeypatch, gone=False, run_config={
        "ops": {"answers_in_flight": {"config": {"first_never_answered": True}}}})
    assert "the run worker died" in error.message
    (pipeline,) = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, "answers_in_flight") == {
        f"k{i}": f"answer k{i}" for i in range(1, IN_FLIGHT)}


PAUSE = 30.0  # each item's retry pause, by the resource's settings


def fail_as_the_run_worker_dies(item):
    parent.RUN_WORKER_GONE.set()  # what the watch thread sets once the run worker died
    raise ClassifiedError(category="server_error", retryable=True, message="the provider answered 503")


@recoverable_op
def pauses_in_threads(ctx):
    ctx.map(fail_as_the_run_worker_dies, ["a", "b", "c"], concurrency=3)


@recoverable_op
async def pauses_in_tasks(ctx):
    async def fail(item):
        fail_as_the_run_worker_dies(item)

    await ctx.amap(fail, ["a", "b", "c"], concurrency=3)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("op", [pauses_in_threads, pauses_in_tasks], ids=["threads", "tasks"])
def test_an_items_retry_pause_ends_once_the_run_worker_died(op, store, db_url, monkeypatch):
    """Every item in a retry pause as the run worker dies: the pauses end, and the step with them, instead of
    waiting out the pause (an asyncio task woke only at its end, a thread when another item ended; a long
    Retry-After kept the orphaned step process alive, and the heartbeat timeout is ten times the pause here)."""

    @job(executor_def=with_recovery(in_process_executor))
    def pausing_job():
        op()

    began = time.monotonic()
    error = failure_in_a_step_process(pausing_job, db_url, monkeypatch, gone=False, heartbeat_timeout=10 * PAUSE,
                                      retry_initial_delay=PAUSE, retry_jitter=0.0, max_retries=3)
    assert time.monotonic() - began < PAUSE  # the pauses ended before their time
    assert "the run worker died" in error.message
    (pipeline,) = store.reports.list_pipelines()
    assert store.pipelines.completed_items(pipeline.id, op.name) == {}


@recoverable_op(required_resource_keys={"llm"}, config_schema={"in_tasks": Field(bool, default_value=False)})
async def asks_a_provider_in_an_outage(ctx):
    """Each request gets a 503 with a long Retry-After, and the client pauses to retry it; the run worker dies in
    that pause (the test sets it gone once both requests were answered)."""
    llm = ctx.context.resources.llm

    def ask(item):
        return llm.get_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": item.key}]).choices[0].message.content

    async def ask_async(item):
        answer = await llm.get_async_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": item.key}])
        return answer.choices[0].message.content

    if ctx.context.op_config["in_tasks"]:
        await ctx.amap(ask_async, ["a", "b"], concurrency=2)
    else:
        await asyncio.to_thread(ctx.map, ask, ["a", "b"], concurrency=2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("in_tasks", [False, True], ids=["threads", "tasks"])
def test_a_provider_clients_retry_pause_ends_once_the_run_worker_died(in_tasks, store, db_url, monkeypatch):
    """The pause of the SDK client's own retry (the journaling transport's, under the shared policy) ends too:
    it woke only on a take-over, and a `Retry-After` of minutes kept the orphaned step process alive."""
    server = SdkStandIn(retry_after=PAUSE)
    url = server.start()
    server.script = [503] * 100
    llm = LLMResource(provider="openai", base_url=f"{url}/v1", model="m", api_key="sk-test", timeout=10,
                      initial_delay=PAUSE, max_delay=2 * PAUSE)

    @job(executor_def=with_recovery(in_process_executor))
    def outage_job():
        asks_a_provider_in_an_outage()

    failed: list[BaseException] = []

    def run_worker_dies_in_the_pause() -> None:
        # once both requests were answered, not after a fixed time: on a busy machine the step may take longer than
        # that to send them, and then the run worker was gone before the first request (none was sent)
        try:
            wait_for(lambda: len(server.statuses()) >= 2, timeout=PAUSE / 2, interval=0.02, what="both requests")
        except BaseException as exc:  # noqa: BLE001 - raised again by the test, after the run
            failed.append(exc)
        else:
            parent.RUN_WORKER_GONE.set()

    dies = threading.Thread(target=run_worker_dies_in_the_pause, daemon=True)
    dies.start()
    began = time.monotonic()
    try:
        error = failure_in_a_step_process(outage_job, db_url, monkeypatch, gone=False, heartbeat_timeout=10 * PAUSE,
                                          resources={"llm": llm}, run_config={"ops": {"asks_a_provider_in_an_outage": {
                                              "config": {"in_tasks": in_tasks}}}})
    finally:
        dies.join()
        parent.RUN_WORKER_GONE.clear()  # set after the run ended, it would stop the next test's step
        server.stop()
    if failed:
        raise failed[0]
    assert time.monotonic() - began < PAUSE  # the pauses ended before their time
    assert "the run worker died" in error.message
    assert server.statuses() == [503, 503]  # one request each, not retried


@recoverable_op
def stops_early_while_others_pause(ctx):
    """Two items fail for good at once (the same error twice: the map stops early) while a third pauses to retry."""
    def item_fn(item):
        if item.key == "pauses":
            raise ClassifiedError(category="server_error", retryable=True, message="the provider answered 503")
        raise ClassifiedError(category="validation", retryable=False, message=f"bad document {item.key}")

    ctx.map(item_fn, ["pauses", "bad-1", "bad-2"], concurrency=3)


@job(executor_def=with_recovery(in_process_executor))
def stopping_early_job():
    stops_early_while_others_pause()


def test_a_map_that_stops_early_reports_its_failed_items_not_a_take_over(store, db_url, monkeypatch):
    """A new user's trial: the map's own stop ended a thread's retry pause with a StopRequested, which the map took
    for a stop of the node (a take-over): the step said "superseded by another run; stopped without writing",
    hid the items' failures and left the pipeline running."""
    result = execute_in_process(stopping_early_job, raise_on_error=False, resources={"recovery": RecoveryResource(
        database_url=db_url, same_error_limit=2, max_retries=3, retry_initial_delay=PAUSE, retry_jitter=0.0)})
    (failure,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    message = failure.event_specific_data.error.message
    assert "superseded" not in message and "bad document bad-1" in message and "bad document bad-2" in message
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "failed"
