"""A run's page shows its nodes' item progress: the run tag `recovery/progress` ("n1 6/12 items") and a line in the
run's log when a node's items start and end (and every few seconds between), a resume counting the items it kept."""

from __future__ import annotations

from dagster import DagsterInstance, RetryPolicy, in_process_executor, job

from e2e_defs import items_job_inprocess
from recovery_ext import RecoveryResource, execute_in_process, recoverable_op, with_recovery
from recovery_ext._dagster.tags import TAG_PROGRESS


def test_a_run_shows_each_node_s_item_progress(db_url):
    config = {"ops": {n: {"config": {"items": 3, "item_seconds": 0.0}} for n in ("n1", "n2", "n3", "n4")}}
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(items_job_inprocess, instance=instance, run_config=config, resources={
            "recovery": RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=3)})
        assert result.success
        assert instance.get_run_by_id(result.run_id).tags[TAG_PROGRESS] == "n4 3/3 items"  # the last node's end
        lines = [e.user_message for e in instance.all_logs(result.run_id)
                 if e.user_message.startswith("recovery-ext: n1 ")]
    assert lines == ["recovery-ext: n1 0/3 items", "recovery-ext: n1 3/3 items"]


ATTEMPTS: list[int] = []


@recoverable_op(retry_policy=RetryPolicy(max_retries=1))
def all_done_then_retried(ctx):
    ATTEMPTS.append(ctx.context.retry_number)
    for item in ctx.items(["a", "b", "c"]):
        item.complete(item.key)
    if ctx.context.retry_number == 0:
        raise ConnectionResetError("the provider dropped the connection after the last item")  # retried
    return sorted(ctx.completed_items())


@job(executor_def=with_recovery(in_process_executor))
def all_done_job():
    all_done_then_retried()


def test_a_node_whose_items_were_all_done_shows_its_count_once(db_url):
    """The retry finds every item done: its items start and end at 3/3, shown once (a tag write and a log line)."""
    ATTEMPTS.clear()
    with DagsterInstance.ephemeral() as instance:
        result = execute_in_process(all_done_job, instance=instance, resources={
            "recovery": RecoveryResource(database_url=db_url, heartbeat_interval=0.5, heartbeat_timeout=3)})
        assert result.success and ATTEMPTS == [0, 1]
        lines = [e.user_message for e in instance.all_logs(result.run_id)
                 if e.user_message.startswith("recovery-ext: all_done_then_retried ")]
    assert lines == ["recovery-ext: all_done_then_retried 0/3 items", "recovery-ext: all_done_then_retried 3/3 items",
                     "recovery-ext: all_done_then_retried 3/3 items"]  # the first attempt's end, the retry's start
