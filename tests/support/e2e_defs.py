"""A test code location: a job of 4 item-processing nodes that records every business-logic call.

Used in-process by test_recoverable.py and as a real code location by the end-to-end
tests. Settings are short (heartbeat 1 s, timeout 3 s) so crashes are found quickly.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
from dagster import Definitions, Field, in_process_executor, job, multiprocess_executor
from sqlalchemy import Column, Float, Integer, MetaData, Table, Text, insert

from recovery_ext._classify.classifier import with_context
from recovery_ext import RecoveryResource, make_orphan_sensor, recoverable_op, with_recovery
from recovery_ext._dagster.recoverable import TAG_RESUME_NUMBER

calls_metadata = MetaData()
calls = Table(
    "e2e_calls", calls_metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Text), Column("node", Text), Column("item", Text),
    Column("pid", Integer), Column("ppid", Integer), Column("at", Float),
)

NODE_CONFIG = {
    "items": Field(int, default_value=6),
    "item_seconds": Field(float, default_value=0.3),
    "stall_at": Field(int, default_value=-1, description="first run only: stop making progress at this item"),
    "kill_at": Field(int, default_value=-1, description="first run only: kill -9 this step's process at this item"),
    "fail_with_status": Field(int, default_value=0, description="call the fault server; raise on this status"),
    "fault_url": Field(str, default_value=""),
}


def record_call(store, run_id: str, node: str, item: str) -> None:
    # One write transaction (BEGIN IMMEDIATE on SQLite) that holds the write lock before it reads whether the
    # table exists: a deferred one read first, and a heartbeat committed in between made its CREATE fail at once
    # with `database is locked` (SQLite skips the busy wait for a stale snapshot), a retry the test then counted.
    with store.write() as conn:
        calls_metadata.create_all(conn, checkfirst=True)
        conn.execute(insert(calls).values(run_id=run_id, node=node, item=item, pid=os.getpid(), ppid=os.getppid(),
                                          at=time.time()))


def make_item_node(name: str, *, first: bool = False, optional: bool = False):
    def body(ctx, upstream=None):
        cfg = ctx.op_config
        run_id = ctx.context.run_id
        resumed = TAG_RESUME_NUMBER in ctx.context.run.tags
        if cfg["fault_url"]:
            response = httpx.get(cfg["fault_url"], timeout=5)
            if response.status_code >= 400:
                raise with_context(httpx.HTTPStatusError(f"HTTP {response.status_code}: {response.text}",
                                                         request=response.request,
                                                         response=response), model="test-model",
                                   endpoint=cfg["fault_url"])
        for index, item in enumerate(ctx.items(f"{name}-{i}" for i in range(cfg["items"]))):
            if index == cfg["stall_at"] and not resumed:
                while True:  # alive (the watchdog pulses) but making no progress, until superseded
                    ctx.check()
                    ctx.watchdog.superseded.wait(0.1)
            if index == cfg["kill_at"] and not resumed:
                os.kill(os.getpid(), signal.SIGKILL)  # the step process dies; its run worker lives on
            record_call(ctx._store, run_id, name, item.key)
            time.sleep(cfg["item_seconds"])
            item.complete({"item": item.key, "run": run_id})
        return {"node": name, "items": sorted(ctx.completed_items())}

    body.__name__ = name
    return recoverable_op(name=name, config_schema=NODE_CONFIG, optional=optional, ins={} if first else None)(body)


n1 = make_item_node("n1", first=True)
n2 = make_item_node("n2")
n3 = make_item_node("n3")
n4 = make_item_node("n4")
opt = make_item_node("optional_node", optional=True)


def _graph():
    n4(n3(n2(n1())))


items_job = job(name="items_job", executor_def=with_recovery(multiprocess_executor))(_graph)
items_job_inprocess = job(name="items_job_inprocess", executor_def=with_recovery(in_process_executor))(_graph)


@job(name="optional_job", executor_def=with_recovery(in_process_executor))
def optional_job():
    opt(n1())


def test_resource() -> RecoveryResource:
    return RecoveryResource(
        database_url=os.environ.get("RECOVERY_DATABASE_URL"),
        heartbeat_interval=float(os.environ.get("E2E_HEARTBEAT_INTERVAL", "1")),
        heartbeat_timeout=float(os.environ.get("E2E_HEARTBEAT_TIMEOUT", "3")),
        stall_timeout=float(os.environ.get("E2E_STALL_TIMEOUT", "4")),
        max_resumes=int(os.environ.get("E2E_MAX_RESUMES", "3")),
        launch_grace_seconds=float(os.environ.get("E2E_LAUNCH_GRACE", "30")),
        max_retries=3,
        retry_initial_delay=0.01,
        retry_max_delay=0.05,
        same_error_limit=5,
    )


sensor_interval = int(os.environ.get("E2E_SENSOR_INTERVAL", "1"))
jobs = [items_job, items_job_inprocess, optional_job]
per_tick = int(os.environ["E2E_MAX_PER_TICK"]) if os.environ.get("E2E_MAX_PER_TICK") else None
sensors = [make_orphan_sensor(jobs, minimum_interval_seconds=sensor_interval, max_resumes_per_tick=per_tick)]
if os.environ.get("E2E_TWO_SENSORS"):
    sensors.append(make_orphan_sensor(jobs, name="recovery_orphan_sensor_twin",
                                      minimum_interval_seconds=sensor_interval, max_resumes_per_tick=per_tick))




def bound_items_job():
    """The multiprocess job with its resources, for ``reconstructable``."""
    return defs.get_job_def("items_job")


# -- stock Dagster baseline and a plain burst sensor, for bench/recovery_bench.py ------------------

def make_stock_node(name: str):
    from dagster import OpExecutionContext, op

    def process(context: OpExecutionContext) -> dict:
        cfg = context.op_config
        store = context.resources.recovery.get_store()
        for i in range(cfg["items"]):
            record_call(store, context.run_id, name, f"{name}-{i}")
            time.sleep(cfg["item_seconds"])
        return {"node": name}

    if name == "n1":
        @op(name=f"stock_{name}", config_schema=NODE_CONFIG, required_resource_keys={"recovery"})
        def first(context):
            return process(context)

        return first

    @op(name=f"stock_{name}", config_schema=NODE_CONFIG, required_resource_keys={"recovery"})
    def later(context, upstream):
        return process(context)

    return later


stock_nodes = {n: make_stock_node(n) for n in ("n1", "n2", "n3", "n4")}


@job(name="stock_items_job", executor_def=multiprocess_executor,
     tags={"dagster/max_retries": "1", "dagster/retry_strategy": "FROM_FAILURE"})
def stock_items_job():
    stock_nodes["n4"](stock_nodes["n3"](stock_nodes["n2"](stock_nodes["n1"]())))


def make_burst_sensor(flag_file: str, count: int):
    """A plain sensor that yields ``count`` RunRequests once, when ``flag_file`` appears."""
    from dagster import DefaultSensorStatus, RunRequest, SkipReason, sensor

    @sensor(job=items_job, minimum_interval_seconds=1, name="plain_burst_sensor",
            default_status=DefaultSensorStatus.RUNNING)
    def burst(context):
        if not os.path.exists(flag_file) or context.cursor == "done":
            return SkipReason("waiting for the flag file")
        context.update_cursor("done")
        return [RunRequest(run_key=f"burst-{i}", tags={"bench": "plain"}) for i in range(count)]

    return burst


if os.environ.get("E2E_BURST_FLAG"):
    defs = Definitions(jobs=jobs + [stock_items_job],
                       sensors=sensors + [make_burst_sensor(os.environ["E2E_BURST_FLAG"],
                                                            int(os.environ.get("E2E_BURST_COUNT", "100")))],
                       resources={"recovery": test_resource()})
else:
    defs = Definitions(jobs=jobs + [stock_items_job], sensors=sensors, resources={"recovery": test_resource()})
