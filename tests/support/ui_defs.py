"""Definitions for the UI check (tests/test_ui_e2e.py): a node that waits out a short provider outage,
and a slow node to crash. No orphan sensor: the crashed run is re-executed from the UI instead."""

from __future__ import annotations

import os
import time

from dagster import Definitions, in_process_executor

from recovery_ext import NodeContext, RecoveryResource, recoverable_job, recoverable_op


@recoverable_op
def flaky_provider(ctx: NodeContext) -> int:
    """Times out twice (the outage), then answers: each timeout pauses the pipeline."""
    if ctx.context.retry_number < 2:
        raise TimeoutError("the provider timed out")
    return ctx.context.retry_number


@recoverable_op
def slow_items(ctx: NodeContext) -> int:
    # slow in the first run, so there is time to kill it; quick in the re-execution that takes over
    seconds = 0.1 if ctx.context.run.parent_run_id else 1.0
    for item in ctx.items(f"item-{n}" for n in range(30)):
        time.sleep(seconds)
        item.complete(item.key)
    return len(ctx.completed_items())


@recoverable_job(executor_def=in_process_executor)
def waiting_job():
    flaky_provider()


@recoverable_job(executor_def=in_process_executor)
def slow_job():
    slow_items()


defs = Definitions(
    jobs=[waiting_job, slow_job],
    resources={"recovery": RecoveryResource(
        database_url=os.environ["RECOVERY_DATABASE_URL"], heartbeat_interval=1, heartbeat_timeout=4,
        same_error_limit=1, max_retries=5, retry_initial_delay=0.1, retry_max_delay=0.2,
        outage_pause_initial=4, outage_pause_max=6)},
)
