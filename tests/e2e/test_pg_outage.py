"""The store survives its database: a real `pg_ctl restart` and a 20 s stop in the middle of a node.

Each test runs its own private PostgreSQL cluster (tests/support/pg_cluster.py) so it can restart it.
The node checkpoints one item at a time; every business call is counted, so an item lost or
done twice shows up.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import threading
import time
import uuid

import pytest
from dagster import Field, in_process_executor, job

from pg_cluster import PrivateCluster
from recovery_pipelines.devserver import wait_for
from recovery_ext._errors import StoreError, StoreUnavailable
from recovery_ext import RecoveryResource, execute_in_process, recoverable_op
from recovery_ext._store.models import PassPlan
from recovery_ext._store.store import RecoveryStore
from helpers import reclaim

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
        box["result"] = execute_in_process(
            outage_job, run_config={"ops": {"slow_items": {"config": {"items": ITEMS, "item_seconds": item_seconds}}}},
            resources={"recovery": resource}, raise_on_error=False)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, box


def wait_for_items(store: RecoveryStore, at_least: int, timeout: float = 120) -> None:
    def checkpointed() -> bool:
        pipelines = store.reports.list_pipelines()
        return bool(pipelines) and sum(store.reports.node_item_totals(pipelines[0].id).values()) >= at_least

    wait_for(checkpointed, timeout=timeout, interval=0.1, what=f"{at_least} items to be checkpointed")


def assert_nothing_lost_or_doubled(store: RecoveryStore, box) -> None:
    result = box["result"]
    assert result.success, [str(e.event_specific_data) for e in result.all_events
                            if e.event_type_value == "STEP_FAILURE"]
    (p,) = store.reports.list_pipelines()
    assert p.status == "completed" and p.epoch == 1  # finished by its first owner: no resume needed
    assert store.reports.node_item_totals(p.id) == {"slow_items": ITEMS}
    assert {f"item-{i}": 1 for i in range(ITEMS)} == CALLS
    assert result.output_for_node("after") == ITEMS


def outage_mid_node(cluster, make_outage) -> None:
    url = cluster.create_database(f"rx_{uuid.uuid4().hex[:8]}")
    store = RecoveryStore(url, retry_budget=60)
    store.migrate()
    thread, box = run_in_thread(url, item_seconds=0.25)
    wait_for_items(store, 5)
    make_outage()
    thread.join(300)
    assert not thread.is_alive()
    assert_nothing_lost_or_doubled(store, box)
    store.close()


def test_pg_ctl_restart_mid_node_loses_nothing_and_the_node_finishes(cluster, cpu_hog):
    outage_mid_node(cluster, lambda: cluster.restart("fast"))


def test_a_20_second_stop_mid_node_loses_nothing_and_the_node_finishes(cluster, cpu_hog):
    def stop_for_20_seconds():
        cluster.stop("fast")
        time.sleep(20)  # the outage itself is what is under test, not a wait for a condition
        cluster.start()

    outage_mid_node(cluster, stop_for_20_seconds)


RELEASE = threading.Event()


@recoverable_op(optional=True)
def optional_writer(ctx):
    RELEASE.wait(120)
    with ctx.transaction() as tx:
        tx.execute(__import__("sqlalchemy").text("SELECT 1"))
    return "wrote"


@recoverable_op
def required_writer(ctx, upstream):
    return upstream


@job(executor_def=in_process_executor)
def budget_job():
    required_writer(optional_writer())


def test_past_the_budget_an_optional_node_degrades_and_a_required_node_fails_until_the_database_is_back(cluster):
    url = cluster.create_database(f"rx_{uuid.uuid4().hex[:8]}")
    store = RecoveryStore(url, retry_budget=30)
    store.migrate()
    RELEASE.clear()
    resource = RecoveryResource(database_url=url, heartbeat_interval=1.0, heartbeat_timeout=30.0,
                                database_retry_budget=3.0)
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=execute_in_process(
        budget_job, resources={"recovery": resource}, raise_on_error=False)), daemon=True)
    thread.start()
    wait_for(
        lambda: (
            store.reports.list_pipelines()
            and store.pipelines.get_node(store.reports.list_pipelines()[0].id, "optional_writer").status == "running"
        ),
        timeout=120,
        interval=0.1,
        what="optional_writer to run",
    )
    cluster.stop("fast")
    RELEASE.set()
    thread.join(180)
    result = box["result"]
    cluster.start()
    assert not result.success
    optional_output = next(e for e in result.all_events
                           if e.step_key == "optional_writer" and e.event_type_value == "STEP_OUTPUT")
    assert "degraded (database unavailable)" in str(optional_output.event_specific_data.metadata["recovery"])
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "required_writer"
    assert "resumes once the database is back" in str(failure.event_specific_data.error)
    (p,) = store.reports.list_pipelines()
    assert p.status == "running"  # nothing was marked permanent
    (reclaimed,), _ = reclaim(store, PassPlan(limit=1, dead_owner_runs=[result.run_id], launching=True))
    assert reclaimed.pipeline_id == p.id and reclaimed.reset_nodes == ("optional_writer",)
    store.close()


def test_a_server_that_stops_answering_new_connections_is_an_outage_retried_until_it_answers_again(cluster, caplog):
    """Unreachable is not refused: nothing answers, so psycopg's connect_timeout fires
    (ConnectionTimeout, an OperationalError with no SQLSTATE). Within its budget the store retries it;
    past the budget it is StoreUnavailable (an optional node degrades, a required one waits for the
    database), like a refusal, not a plain StoreError."""
    url = cluster.create_database(f"rx_{uuid.uuid4().hex[:8]}")
    with RecoveryStore(url) as setup:
        setup.migrate()
    caplog.set_level(logging.WARNING, logger="recovery_ext._store.store")
    postmaster = cluster.postmaster_pid()
    box = {}
    os.kill(postmaster, signal.SIGSTOP)
    try:
        with (RecoveryStore(url, retry_budget=2, connect_timeout=1) as short,
              pytest.raises(StoreUnavailable, match="database unavailable: connection timeout expired")):
            short.reports.list_pipelines()
        store = RecoveryStore(url, retry_budget=60, connect_timeout=1)  # a new pool: its first call must connect
        retried_before = sum("retrying" in r.getMessage() for r in caplog.records)
        thread = threading.Thread(target=lambda: box.update(pipelines=store.reports.list_pipelines()), daemon=True)
        thread.start()
        wait_for(lambda: sum("retrying" in r.getMessage() for r in caplog.records) > retried_before,
                 timeout=60, interval=0.1, what="a connect timeout to be retried")
        assert thread.is_alive(), f"the call ended while the server could not answer: {box}"
    finally:
        os.kill(postmaster, signal.SIGCONT)
    thread.join(60)
    assert not thread.is_alive() and box == {"pipelines": []}
    store.close()


def test_a_database_that_does_not_exist_fails_at_once_with_a_clear_error(cluster, caplog):
    """A connect failure with no SQLSTATE that no retry can fix is not retried for the whole budget."""
    caplog.set_level(logging.WARNING, logger="recovery_ext._store.store")
    store = RecoveryStore(f"postgresql://postgres@127.0.0.1:{cluster.port}/rx_no_such_database", retry_budget=60)
    with pytest.raises(StoreError) as raised:
        store.reports.list_pipelines()
    assert not isinstance(raised.value, StoreUnavailable)
    assert 'database "rx_no_such_database" does not exist' in str(raised.value)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    store.close()
