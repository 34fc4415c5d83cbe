"""The store survives its database: a real `pg_ctl restart` and a 20 s stop in the middle of a node.

Each test runs its own private PostgreSQL cluster (tests/pg_cluster.py) so it can restart it.
The node checkpoints one item at a time; every business call is counted, so an item lost or
done twice shows up.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid

import pytest
from dagster import Field, in_process_executor, job

from pg_cluster import PrivateCluster
from recovery_ext.integration import RecoveryResource, recoverable_op
from recovery_ext.store import RecoveryStore

ITEMS = 24
CALLS: collections.Counter = collections.Counter()


@recoverable_op(config_schema={"items": Field(int), "item_seconds": Field(float)})
def slow_items(ctx):
    for item in ctx.items(f"item-{i}" for i in range(ctx.op_config["items"])):
        CALLS[item.key] += 1
        time.sleep(ctx.op_config["item_seconds"])
        item.complete({"item": item.key}, also=lambda tx: None)
    return sorted(ctx.completed_items())


@recoverable_op
def after(ctx, done):
    with ctx.transaction() as tx:
        tx.execute(__import__("sqlalchemy").text("SELECT 1"))
    return len(done)


@job(executor_def=in_process_executor)
def outage_job():
    after(slow_items())


@pytest.fixture
def cluster():
    c = PrivateCluster().init()
    c.start()
    try:
        yield c
    finally:
        c.destroy()


def run_in_thread(url: str, item_seconds: float):
    CALLS.clear()
    resource = RecoveryResource(database_url=url, heartbeat_interval=1.0, heartbeat_timeout=45.0)
    box = {}

    def go():
        box["result"] = outage_job.execute_in_process(
            run_config={"ops": {"slow_items": {"config": {"items": ITEMS, "item_seconds": item_seconds}}}},
            resources={"recovery": resource}, raise_on_error=False)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, box


def wait_for_items(store: RecoveryStore, at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pipelines = store.list_pipelines()
        if pipelines and sum(store.node_item_totals(pipelines[0].id).values()) >= at_least:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {at_least} items were checkpointed in {timeout} s")


def assert_nothing_lost_or_doubled(store: RecoveryStore, box) -> None:
    result = box["result"]
    assert result.success, [str(e.event_specific_data) for e in result.all_events
                            if e.event_type_value == "STEP_FAILURE"]
    (p,) = store.list_pipelines()
    assert p.status == "completed" and p.epoch == 1  # finished by its first owner: no resume needed
    assert store.node_item_totals(p.id) == {"slow_items": ITEMS}
    assert CALLS == {f"item-{i}": 1 for i in range(ITEMS)}
    assert result.output_for_node("after") == ITEMS


def test_pg_ctl_restart_mid_node_loses_nothing_and_the_node_finishes(cluster, cpu_hog):
    url = cluster.create_database(f"rx_{uuid.uuid4().hex[:8]}")
    store = RecoveryStore(url, retry_budget=60)
    store.migrate()
    thread, box = run_in_thread(url, item_seconds=0.25)
    wait_for_items(store, 5)
    cluster.restart("fast")
    thread.join(300)
    assert not thread.is_alive()
    assert_nothing_lost_or_doubled(store, box)
    store.close()


def test_a_20_second_stop_mid_node_loses_nothing_and_the_node_finishes(cluster, cpu_hog):
    url = cluster.create_database(f"rx_{uuid.uuid4().hex[:8]}")
    store = RecoveryStore(url, retry_budget=60)
    store.migrate()
    thread, box = run_in_thread(url, item_seconds=0.25)
    wait_for_items(store, 5)
    cluster.stop("fast")
    stopped_at = time.monotonic()
    time.sleep(20)  # the outage itself is the thing under test, not a wait for a condition
    cluster.start()
    thread.join(300)
    assert not thread.is_alive()
    assert time.monotonic() - stopped_at >= 20
    assert_nothing_lost_or_doubled(store, box)
    store.close()
