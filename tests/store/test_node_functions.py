"""A node's start and completion: one server-side call each on PostgreSQL, the same behaviour as
the multi-statement transaction SQLite runs (issue 11 item 6). Store tests run on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from helpers import drop_answers_once, round_trips, sent_round_trips
from recovery_ext._errors import IllegalTransition, NotFound, OwnershipLost, UnfinishedItems
from recovery_ext._store.models import ItemCheckpoint
from recovery_ext._store.schema import transitions
from recovery_ext._store.store import RecoveryStore
import store_rows


def history(store, pipeline_id):
    with store.read() as conn:
        return [(r.entity_type, r.from_status, r.to_status, r.event, r.data) for r in conn.execute(
            select(transitions).where(transitions.c.pipeline_id == pipeline_id).order_by(transitions.c.id))]


def test_begin_and_complete_record_the_same_history_on_both_databases(store):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner="run-1", origin_run_id="run-1")
    begun_own, node, started = store.pipelines.begin_node("run-1", "a", heartbeat_timeout=30, stall_timeout=60)
    assert started and begun_own == own and (node.status, node.attempts, node.run_id) == ("running", 1, "run-1")
    assert node.heartbeat_deadline is not None and node.stall_deadline is not None
    assert store.pipelines.get_pipeline(own.pipeline_id).current_node == "a"
    assert store.pipelines.complete_node(own, "a", {"out": [1, 2]}, heartbeat_timeout=30) is False
    assert store.pipelines.get_node(own.pipeline_id, "a").output == {"out": [1, 2]}
    again = store.pipelines.begin_node("run-1", "a")
    assert again is not None and again[2] is False and again[1].status == "completed"  # finished: skipped
    store.pipelines.begin_node("run-1", "b")
    assert store.pipelines.complete_node(own, "b", None) is True
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "completed"
    owner = {"epoch": own.epoch, "owner": "run-1"}
    assert history(store, own.pipeline_id)[-5:] == [
        ("node", "pending", "running", "started", owner), ("node", "running", "completed", "completed", owner),
        ("node", "pending", "running", "started", owner), ("node", "running", "completed", "completed", owner),
        ("pipeline", "running", "completed", "completed", owner)]
    assert store.pipelines.begin_node("run-1", "a") is None  # no running pipeline owned by run-1 any more


def test_refusals_raise_the_same_errors_and_write_nothing(store):
    own = store.pipelines.create_pipeline("job", ["a", "b"], owner="run-1", origin_run_id="run-1")
    with pytest.raises(IllegalTransition, match=r"node 'a' of pipeline \d+: pending -> completed is not allowed"):
        store.pipelines.complete_node(own, "a", 1)
    store.pipelines.begin_node("run-1", "a")
    store.pipelines.start_items(own, "a", 2)
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
    with pytest.raises(UnfinishedItems, match="1 of its 2 items are unfinished"):
        store.pipelines.complete_node(own, "a", 1)
    with pytest.raises(NotFound, match="has no node .zzz."):
        store.pipelines.complete_node(own, "zzz", 1)
    before = history(store, own.pipeline_id)
    store_rows.fail_pipeline(store, own.pipeline_id, "operator said so")
    with pytest.raises(OwnershipLost, match=r"run-1 \(pipeline failed\)"):
        store.pipelines.complete_node(own, "a", 1)
    assert store.pipelines.get_node(own.pipeline_id, "a").status == "running"
    assert history(store, own.pipeline_id)[: len(before)] == before
    assert [h[3] for h in history(store, own.pipeline_id)[len(before):]] == ["failed_by_operator"]


def test_a_call_whose_commit_landed_before_its_connection_dropped_is_retried_quietly(pg_url, monkeypatch):
    """The server ran the function (autocommit: committed), then the client lost the answer: the store
    retries, and the second attempt sees its own first attempt's work instead of refusing it."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
        dropped = drop_answers_once(monkeypatch, "begin_node", "complete_node")
        _, node, started = store.pipelines.begin_node("run-1", "a")
        assert started and node.attempts == 1  # counted once
        assert (
            store.pipelines.complete_node(own, "a", {"v": 1}) is True
        )  # the pipeline it finished is reported finished
        assert dropped == ["begin_node", "complete_node"]
        events_ = [h[3] for h in history(store, own.pipeline_id) if h[3] != "created"]
        assert events_ == ["started", "completed", "completed"]  # node started once, node and pipeline completed once
    finally:
        store.close()


def test_each_is_one_round_trip_on_postgresql(pg_url):
    """Begin, complete, the items' start and the breaker read: one Sync each on the wire, no BEGIN/COMMIT
    (after the first use on a connection, which also sends the Parse of the prepared statement)."""
    store = RecoveryStore(pg_url)
    try:
        store.migrate()
        own = store.pipelines.create_pipeline("job", ["a", "b"], owner="run-1", origin_run_id="run-1")
        for name in ("a", "b"):
            calls = [lambda name=name: store.pipelines.begin_node("run-1", name, stall_timeout=30),
                     lambda name=name: store.pipelines.start_items(own, name, 1),
                     lambda name=name: store.pipelines.completed_items(own.pipeline_id, name),
                     lambda: store.providers.breaker_before_call("http://127.0.0.1:1/v1", "run-1", probe_timeout=30)]
            for call in calls:
                with round_trips(store) as messages:
                    call()
                if name == "b":  # "a" prepared them
                    assert sent_round_trips(messages) == ["Sync"], messages
                    assert messages[-1] == "B ReadyForQuery I", messages  # autocommit: nothing left open
            store.pipelines.checkpoint_item(own, name, ItemCheckpoint("k1", 1))
            with round_trips(store) as messages:
                assert store.pipelines.complete_node(own, name, {"v": name}, heartbeat_timeout=30) is (name == "b")
            if name == "b":
                assert sent_round_trips(messages) == ["Sync"], messages
                assert messages[-1] == "B ReadyForQuery I", messages
        assert [(n.status, n.output) for n in (store.pipelines.get_node(own.pipeline_id, x) for x in "ab")] == [
            ("completed", {"v": "a"}), ("completed", {"v": "b"})]
    finally:
        store.close()


def test_starting_items_sets_the_count_returns_the_checkpoints_and_is_fenced(store):
    own = store.pipelines.create_pipeline("job", ["a"], owner="run-1", origin_run_id="run-1")
    store.pipelines.begin_node("run-1", "a")
    assert store.pipelines.start_items(own, "a", 3) == {}
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k2", None, status="degraded"))
    assert store.pipelines.start_items(own, "a", 4) == {"k1": "completed", "k2": "degraded"}
    assert store.pipelines.get_node(own.pipeline_id, "a").items_total == 4
    store_rows.fail_pipeline(store, own.pipeline_id, "operator said so")
    with pytest.raises(OwnershipLost):
        store.pipelines.start_items(own, "a", 9)
    assert store.pipelines.get_node(own.pipeline_id, "a").items_total == 4  # the refused call changed nothing
