"""Nothing lost (issue 9 item 1): a node whose ``ctx.items(keys)`` left keys unfinished cannot complete.

The rule lives in the store's complete path, so it holds for every recoverable op, not only OCR.
Store tests run on SQLite and on a real PostgreSQL database.
"""

from __future__ import annotations

import pytest
from dagster import in_process_executor, job
from sqlalchemy import func, select

from recovery_ext._errors import UnfinishedItems
from recovery_ext import RecoveryResource, execute_in_process, recoverable_op, with_recovery
from recovery_ext._store.models import ErrorInfo, ItemCheckpoint, NodeSpec
from recovery_ext._store.schema import transitions


def make(store, nodes_=("a", "b")):
    return store.pipelines.create_pipeline("job", list(nodes_), owner="run-1", origin_run_id="run-1")


def completions(store, pipeline_id):
    with store.read() as conn:
        return conn.scalar(select(func.count()).select_from(transitions).where(
            transitions.c.pipeline_id == pipeline_id, transitions.c.to_status == "completed"))


def test_a_node_with_unfinished_items_cannot_complete_and_nothing_is_written(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.start_items(own, "a", 3)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", {"r": 1}))
    # explicitly degraded counts as finished
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k2", {"r": 2}, status="degraded"))
    with pytest.raises(UnfinishedItems, match="1 of its 3 items are unfinished"):
        store.pipelines.complete_node(own, "a", {"done": True})
    node = store.pipelines.get_node(own.pipeline_id, "a")
    assert (node.status, node.output) == ("running", None)
    assert completions(store, own.pipeline_id) == 0

    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k3", {"r": 3}))
    assert store.pipelines.complete_node(own, "a", {"done": True}) is False
    assert store.pipelines.get_node(own.pipeline_id, "a").status == "completed"


def test_a_node_that_never_asked_for_items_completes_as_before(store):
    own = make(store, nodes_=("a",))
    store.pipelines.start_node(own, "a")
    assert store.pipelines.complete_node(own, "a", 1) is True
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "completed"


def test_the_last_node_refused_leaves_the_pipeline_running_not_completed(store):
    own = make(store, nodes_=(NodeSpec("a", optional=True),))
    store.pipelines.start_node(own, "a")
    store.pipelines.start_items(own, "a", 2)
    with pytest.raises(UnfinishedItems):
        store.pipelines.complete_node(own, "a")
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "running"
    store.pipelines.degrade_node(own, "a", ErrorInfo("gave up on its items", "permanent"))  # the explicit way out
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "completed"


@recoverable_op(ins={})
def quits_early(ctx):
    for index, item in enumerate(ctx.items(["d1", "d2", "d3"])):
        if index == 2:
            break  # a body bug: it returns before its last item
        item.complete({"key": item.key})
    return {"done": sorted(ctx.completed_items())}


@recoverable_op(ins={}, optional=True)
def quits_early_optional(ctx):
    for item in ctx.items(["o1", "o2"]):
        item.complete()
        break
    return {}


@recoverable_op(ins={})
def finishes_all(ctx):
    for item in ctx.items(["f1", "f2"]):
        item.complete()
    return {"done": sorted(ctx.completed_items())}


@job(executor_def=with_recovery(in_process_executor))
def early_job():
    quits_early()


@job(executor_def=with_recovery(in_process_executor))
def optional_early_job():
    quits_early_optional()
    finishes_all()


def run(job_def, url):
    resource = RecoveryResource(database_url=url, heartbeat_interval=0.5, heartbeat_timeout=3, max_retries=0)
    return execute_in_process(job_def, resources={"recovery": resource}, raise_on_error=False)


def test_an_op_that_returns_before_finishing_its_items_fails_with_a_clear_error(store, db_url):
    result = run(early_job, db_url)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "quits_early"
    assert "node 'quits_early'" in str(failure.event_specific_data.error)
    assert "1 of its 3 items are unfinished" in str(failure.event_specific_data.error)
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "failed" and "1 of its 3 items are unfinished" in (pipeline.error or "")
    (node,) = store.pipelines.list_nodes(pipeline.id)
    assert (node.status, node.output) == ("failed", None)
    assert sorted(store.pipelines.completed_items(pipeline.id, "quits_early")) == ["d1", "d2"]
    assert completions(store, pipeline.id) == 0


def test_an_optional_op_that_returns_before_finishing_its_items_degrades(store, db_url):
    result = run(optional_early_job, db_url)
    assert result.success
    (pipeline,) = store.reports.list_pipelines()
    assert pipeline.status == "completed"
    statuses = {n.name: n.status for n in store.pipelines.list_nodes(pipeline.id)}
    assert statuses == {"quits_early_optional": "degraded", "finishes_all": "completed"}
    degraded = store.pipelines.get_node(pipeline.id, "quits_early_optional")
    assert "1 of its 2 items are unfinished" in (degraded.error or "")
