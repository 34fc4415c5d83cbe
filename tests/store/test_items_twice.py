"""An item of ``ctx.items`` completes once: a second ``complete``, ``degrade`` or ``acomplete`` of the same item is
refused with a Failure that names it, and the first result is what its checkpoint keeps (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest
from dagster import DagsterInstance, Failure, build_op_context

from helpers import running_node
from recovery_ext._dagster.context import NodeContext
from recovery_ext._liveness.heartbeat import HeartbeatSettings


@pytest.mark.parametrize("batch", [1, 50])
def test_an_item_completed_twice_is_refused_and_its_first_result_kept(store, batch):
    own = running_node(store)
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        loop = ctx.items(["k1", "k2"], batch=batch)
        item = next(loop)
        item.complete("first")
        with pytest.raises(Failure, match="item 'k1' of node a completed twice"):
            item.complete("second")
        with pytest.raises(Failure, match="item 'k1' of node a completed twice"):
            item.degrade("fallback")
        next(loop).complete("other")
        with pytest.raises(StopIteration):
            next(loop)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": "first", "k2": "other"}
    assert (ctx.items_done, ctx.items_degraded) == (2, 0)


def test_a_buffered_item_checkpointed_again_by_its_key_is_refused_before_its_batch_commits(store):
    """``ctx.checkpoint(key)`` of an item a batched loop completed and still holds: refused by the buffer, and the
    batch then commits the item's first result."""
    own = running_node(store)
    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        for item in ctx.items(["k1", "k2"], batch=50):
            item.complete(f"first {item.key}")
            if item.key == "k1":
                with pytest.raises(Failure, match="item 'k1' of node a completed twice"):
                    ctx.checkpoint("k1", "again")
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": "first k1", "k2": "first k2"}


def test_an_item_completed_twice_in_async_code_is_refused(store):
    own = running_node(store)

    async def body(ctx: NodeContext) -> None:
        async for item in ctx.aitems(["k1"]):
            await item.acomplete("first")
            with pytest.raises(Failure, match="item 'k1' of node a completed twice"):
                await item.acomplete("second")

    with DagsterInstance.ephemeral() as instance:
        ctx = NodeContext(build_op_context(instance=instance), store, own, "a", HeartbeatSettings(), None, None)
        asyncio.run(body(ctx))
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": "first"}
