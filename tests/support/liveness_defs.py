"""A code location for the run-liveness tests (tests/e2e/test_liveness.py) under a real `dagster dev`.

``healthy_job`` puts everything that used to look dead between recoverable ops: a plain op
lasting 3x the heartbeat timeout, an in-run retry whose delay is longer than the timeout,
and two ops sharing a concurrency pool of limit 1 (set in the instance), so one waits for
the other. ``branch_job`` takes one branch of a conditional. ``slow_job`` runs long enough to
be canceled, and ``failing_items_job`` fails mid-items once, for a re-execution from failure.
"""

from __future__ import annotations

import os
import time

from dagster import Definitions, Field, In, Out, Output, in_process_executor, job, multiprocess_executor, op
from sqlalchemy import Column, Float, Integer, MetaData, Table, Text, insert

from recovery_ext import RecoveryResource, make_orphan_sensor, recoverable_op, with_recovery

TIMEOUT = float(os.environ.get("LIVENESS_HEARTBEAT_TIMEOUT", "3"))
INTERVAL = float(os.environ.get("LIVENESS_HEARTBEAT_INTERVAL", "1"))
POOL = "liveness_pool"
FAIL_FLAG = os.environ.get("LIVENESS_FAIL_FLAG", "")

trace_metadata = MetaData()
trace = Table(
    "liveness_trace", trace_metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Text), Column("node", Text), Column("item", Text),
    Column("started", Float), Column("ended", Float), Column("pid", Integer),
)


def record(store, run_id: str, node: str, item: str, started: float) -> None:
    trace_metadata.create_all(store.engine, checkfirst=True)
    with store.engine.begin() as conn:
        conn.execute(insert(trace).values(run_id=run_id, node=node, item=item, started=started, ended=time.time(),
                                          pid=os.getpid()))


def _items(ctx, name: str, count: int, seconds: float) -> dict:
    for item in ctx.items(f"{name}-{i}" for i in range(count)):
        started = time.time()
        if FAIL_FLAG and name == "work" and item.key == "work-3" and os.path.exists(FAIL_FLAG):
            os.remove(FAIL_FLAG)  # fail once, permanently, mid-items
            raise ValueError("bad input at work-3 (permanent)")
        time.sleep(seconds)
        record(ctx._store, ctx.context.run_id, name, item.key, started)
        item.complete(item.key)
    return {"node": name, "items": sorted(ctx.completed_items())}


@recoverable_op(ins={})
def prepare(ctx):
    return _items(ctx, "prepare", 2, 0.2)


@op(ins={"upstream": In()}, out=Out())
def plain_wait(context, upstream):
    """A plain (non-recoverable) op: 3x the heartbeat timeout with no node heartbeat at all."""
    time.sleep(3 * TIMEOUT)
    return upstream


def _pooled_op(name: str):
    """A recoverable op in the concurrency pool (limit 1): with a dozen runs queued on it, the ops behind it
    wait for the slot longer than the heartbeat timeout. ``hold_fraction`` of the timeout is how long it holds
    the slot once started: long enough by default for the step-kill test to kill it mid-way; a run that only
    needs it to hold the slot passes less (a dozen runs queue on the slot either way)."""
    def body(ctx, upstream):
        started = time.time()
        record(ctx._store, ctx.context.run_id, name, "start", started)  # its pid, for the step-kill test
        time.sleep(TIMEOUT * ctx.op_config["hold_fraction"])
        record(ctx._store, ctx.context.run_id, name, "slot", started)
        return {"node": name}

    body.__name__ = name
    return recoverable_op(name=name, pool=POOL,
                          config_schema={"hold_fraction": Field(float, default_value=0.6)})(body)


pooled_a = _pooled_op("pooled_a")
pooled_b = _pooled_op("pooled_b")


@recoverable_op
def finish(ctx, waited, a, b):
    """Fails its first attempt with a transient error; the retry delay is longer than the timeout."""
    record(ctx._store, ctx.context.run_id, "finish", f"attempt-{ctx.context.retry_number}", time.time())
    if ctx.context.retry_number == 0:
        raise TimeoutError("the provider timed out (first attempt only)")
    return {"done": True}


def _healthy():
    first = prepare()
    finish(plain_wait(first), pooled_a(first), pooled_b(first))


# the same graph under both executors; runs share the pool, so they also wait for each other
healthy_job = job(name="healthy_job", executor_def=with_recovery(multiprocess_executor))(_healthy)
healthy_job_inprocess = job(name="healthy_job_inprocess", executor_def=with_recovery(in_process_executor))(_healthy)


# -- a conditional branch: one optional output is never produced -------------------------------------

@op(out={"left": Out(is_required=False), "right": Out(is_required=False)})
def choose(context):
    yield Output({"branch": "left"}, "left")


@recoverable_op
def left_branch(ctx, chosen):
    return _items(ctx, "left", 2, 0.1)


@recoverable_op
def right_branch(ctx, chosen):
    return _items(ctx, "right", 2, 0.1)


@job(executor_def=with_recovery(in_process_executor))
def branch_job():
    left, right = choose()
    left_branch(left)
    right_branch(right)


# -- long enough to cancel; items to re-execute from failure ----------------------------------------

@recoverable_op(ins={}, config_schema={"item_seconds": Field(float, default_value=0.3)})
def work(ctx):
    return _items(ctx, "work", 8, ctx.op_config["item_seconds"])


@recoverable_op
def after_work(ctx, upstream):
    return _items(ctx, "after", 2, 0.1)


@job(executor_def=with_recovery(multiprocess_executor))
def items_job():
    after_work(work())


def resource() -> RecoveryResource:
    return RecoveryResource(
        database_url=os.environ.get("RECOVERY_DATABASE_URL"),
        heartbeat_interval=INTERVAL,
        heartbeat_timeout=TIMEOUT,
        max_resumes=3,
        launch_grace_seconds=60,
        max_retries=2,
        retry_initial_delay=TIMEOUT + 1.5,  # the in-run retry waits longer than the heartbeat timeout
        retry_max_delay=TIMEOUT + 1.5,
        retry_jitter=0.0,
        same_error_limit=5,
    )


jobs = [healthy_job, healthy_job_inprocess, branch_job, items_job]
defs = Definitions(
    jobs=jobs,
    sensors=[make_orphan_sensor(jobs, minimum_interval_seconds=int(os.environ.get("LIVENESS_SENSOR_INTERVAL", "1")),
                                max_resumes_per_tick=20)],
    resources={"recovery": resource()},
)
