"""The run-level lifecycle in the store, on SQLite and PostgreSQL: batched pulses, the orphan
condition with run and node heartbeats, skipped/completed/failed/canceled, take-over."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, update

from helpers import expire, reclaim
from recovery_pipelines.devserver import wait_for
from recovery_ext._errors import IllegalTransition, OwnershipLost
from recovery_ext._liveness.heartbeat import HeartbeatRegistry, HeartbeatSettings
from recovery_ext._store.models import ErrorInfo, ItemCheckpoint, PassPlan, Scope
from recovery_ext._store.models import NodeBeat, PipelineBeat
from recovery_ext._store.schema import nodes, transitions


def make(store, owner="run-1", nodes_=("a", "b", "c")):
    return store.pipelines.create_pipeline("job", list(nodes_), owner=owner, origin_run_id=owner, params={})


def expire_node(store, pipeline_id, name, ago=5.0):
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == pipeline_id, nodes.c.name == name)
                     .values(heartbeat_deadline=store.dialect.now_plus(-ago)))


def moves(store, pipeline_id, entity="pipeline"):
    with store.read() as conn:
        return [tuple(r) for r in conn.execute(
            select(transitions.c.from_status, transitions.c.to_status, transitions.c.event)
            .where(transitions.c.pipeline_id == pipeline_id, transitions.c.entity_type == entity)
            .order_by(transitions.c.id))]


def test_a_node_whose_heartbeat_expired_is_an_orphan_even_while_the_run_heartbeat_is_alive(store):
    own = make(store)
    store.pipelines.start_node(own, "a", heartbeat_timeout=60)
    store.pipelines.pulse([PipelineBeat(own, 60)])
    assert store.recovery.find_orphans() == []
    expire_node(store, own.pipeline_id, "a")
    (orphan,) = store.recovery.find_orphans()
    assert (orphan.id, orphan.reason) == (own.pipeline_id, "node_heartbeat")
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    assert reclaimed.reset_nodes == ("a",)


def test_a_live_run_heartbeat_with_no_node_running_is_not_an_orphan(store):
    own = make(store)
    store.pipelines.start_node(own, "a", heartbeat_timeout=60)
    store.pipelines.complete_node(own, "a", 1)
    expire_node(store, own.pipeline_id, "a")  # a finished node's old deadline means nothing
    store.pipelines.pulse([PipelineBeat(own, 60)])
    assert store.recovery.find_orphans() == []
    expire(store, own.pipeline_id)  # the run heartbeat itself expired: orphan
    assert [o.reason for o in store.recovery.find_orphans()] == ["heartbeat"]


def test_an_owner_dagster_is_retrying_is_never_an_orphan(store):
    own = make(store)
    expire(store, own.pipeline_id)
    assert store.recovery.find_orphans(retrying_owner_runs=["run-1"]) == []
    plan = PassPlan(limit=5, dead_owner_runs=["run-1"], retrying_owner_runs=["run-1"], launching=True)
    assert reclaim(store, plan) == ([], [])
    assert len(store.recovery.find_orphans()) == 1


def test_pulse_is_one_transaction_fenced_by_epoch_and_reports_lost_pipelines(store):
    owners = [make(store, owner=f"run-{i}") for i in range(3)]
    for own in owners:
        store.pipelines.start_node(own, "a", heartbeat_timeout=60)
        expire(store, own.pipeline_id)
        expire_node(store, own.pipeline_id, "a")
    reclaim(store, PassPlan(limit=1, launching=True))
    lost_one = next(o for o in owners if store.pipelines.get_pipeline(o.pipeline_id).epoch != o.epoch)
    lost = store.pipelines.pulse([PipelineBeat(o, 60) for o in owners], [NodeBeat(o, "a", 60) for o in owners])
    assert lost == {lost_one.pipeline_id}
    live = [o for o in owners if o is not lost_one]
    assert store.recovery.find_orphans() == []
    for own in live:
        assert (
            store.pipelines.get_node(own.pipeline_id, "a").heartbeat_deadline
            > store.pipelines.get_pipeline(own.pipeline_id).updated_at
        )
    # the superseded owner's node beat changed nothing: the reclaim reset its node to pending
    assert store.pipelines.get_node(lost_one.pipeline_id, "a").heartbeat_deadline is None


def test_a_step_process_beats_only_its_node_and_the_registry_marks_leases_lost(store):
    own = make(store)
    store.pipelines.start_node(own, "a", heartbeat_timeout=60)
    registry = HeartbeatRegistry(store)
    settings = HeartbeatSettings(interval=0.1, timeout=60)
    node_lease = registry.register(own, settings, node="a")
    expire(store, own.pipeline_id)
    registry.pulse_once()
    assert [o.reason for o in store.recovery.find_orphans()] == ["heartbeat"]  # a node beat never keeps the run alive
    reclaim(store, PassPlan(limit=5, launching=True))
    registry.pulse_once()
    assert node_lease.superseded.is_set()
    with pytest.raises(OwnershipLost):
        node_lease.check()
    assert registry.leases == []


def test_the_registry_thread_is_woken_only_to_shorten_its_tick_or_to_end(store):
    """Every node registers and releases a lease; waking the heartbeat thread for each cost scheduling
    waits on a busy machine. A lease with a shorter interval must still take effect at once."""
    own = make(store)
    registry = HeartbeatRegistry(store)
    woken = []

    class CountedEvent(threading.Event):
        def set(self):
            woken.append(time.monotonic())
            super().set()

    registry._wake = CountedEvent()
    run_lease = registry.register(own, HeartbeatSettings(interval=30, timeout=90))
    wait_for(lambda: registry._tick == 30, timeout=10, interval=0.01, what="the thread to wait out its 30 s tick")
    for node in ("a", "b", "c"):
        registry.register(own, HeartbeatSettings(interval=30, timeout=90), node=node).release()
    assert woken == [] and registry.pulses == 0
    fast = registry.register(own, HeartbeatSettings(interval=0.1, timeout=60), node="fast")
    assert len(woken) == 1
    wait_for(lambda: registry.pulses >= 3, timeout=10, interval=0.02, what="pulses at the 0.1 s tick")
    fast.release()
    run_lease.release()
    assert len(woken) == 2  # the last release ends the thread now
    wait_for(lambda: registry._thread is None, timeout=10, interval=0.02, what="the heartbeat thread to end")


def test_a_successful_run_skips_the_nodes_it_did_not_execute_and_completes(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.complete_node(own, "a", 1)
    store.pipelines.start_node(own, "b")
    store.pipelines.fail_node(own, "b", ErrorInfo("transient", "timeout"), permanent=False)
    assert store.pipelines.complete_run(own) == ["b", "c"]
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert (p.status, p.heartbeat_deadline) == ("completed", None)
    assert [n.status for n in store.pipelines.list_nodes(own.pipeline_id)] == ["completed", "skipped", "skipped"]
    assert ("failed", "skipped", "skipped") in moves(store, own.pipeline_id, "node")
    assert ("pending", "skipped", "skipped") in moves(store, own.pipeline_id, "node")
    assert moves(store, own.pipeline_id)[-1] == ("running", "completed", "completed")


def test_a_run_whose_last_node_completed_the_pipeline_ends_quietly_but_a_taken_over_one_is_refused(store):
    """The common end of a successful run: its last node already completed the pipeline. The run's end
    writes nothing more and raises nothing; a pipeline another epoch completed is still not this run's."""
    own = make(store)
    for name in ("a", "b", "c"):
        store.pipelines.start_node(own, name)
        store.pipelines.complete_node(own, name, name)
    before = moves(store, own.pipeline_id)
    assert store.pipelines.complete_run(own) == []
    assert moves(store, own.pipeline_id) == before  # no second completion recorded
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "completed"
    superseded = own.__class__(own.pipeline_id, own.epoch - 1, own.owner)
    with pytest.raises(OwnershipLost):
        store.pipelines.complete_run(superseded)


def test_a_run_ending_with_a_node_still_running_is_not_completed(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    with pytest.raises(IllegalTransition, match="still running: a"):
        store.pipelines.complete_run(own)
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "running"
    assert store.pipelines.get_node(own.pipeline_id, "b").status == "pending"


def test_a_failed_run_fails_the_pipeline_with_the_steps_error(store):
    own = make(store)
    store.pipelines.fail_run(own, "step plain failed: bad token sk-abcdefghijklmnopqrstuvwx")
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.status == "failed" and "step plain failed" in p.error and "sk-abcdef" not in p.error


def test_cancel_is_terminal_recorded_and_never_an_orphan(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.cancel_run(own, "run run-1 was canceled by its user")
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert (p.status, p.gave_up_reason) == ("canceled", "run run-1 was canceled by its user")
    assert store.pipelines.get_node(own.pipeline_id, "a").status == "failed"
    assert moves(store, own.pipeline_id)[-1] == ("running", "canceled", "canceled")
    expire(store, own.pipeline_id)
    assert store.recovery.find_orphans(dead_owner_runs=["run-1"]) == []
    assert reclaim(store, PassPlan(limit=5, dead_owner_runs=["run-1"], launching=True)) == ([], [])
    assert {r["status"]: r["count"] for r in store.reports.pipeline_summary()}["canceled"] == 1


def test_the_cancel_backstop_cancels_only_what_the_canceled_run_still_owns(store):
    mine = make(store, owner="run-1")
    reclaimed = make(store, owner="run-2")
    expire(store, reclaimed.pipeline_id)
    # recovery moved run-2's pipeline on: terminating run-2 is not a user cancel
    reclaim(store, PassPlan(limit=5, launching=True))
    canceling = PassPlan(limit=0, canceled_owner_runs=("run-1", "run-2"))
    assert store.recovery.recovery_pass(canceling, Scope()).canceled == [mine.pipeline_id]
    assert store.pipelines.get_pipeline(mine.pipeline_id).status == "canceled"
    assert store.pipelines.get_pipeline(reclaimed.pipeline_id).status == "running"
    with pytest.raises(OwnershipLost):
        store.pipelines.cancel_run(reclaimed, "late interrupt of the superseded run")  # fenced by its old epoch
    assert store.pipelines.get_pipeline(reclaimed.pipeline_id).status == "running"


def test_take_over_needs_a_dead_owner_or_a_failed_or_canceled_pipeline(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k1", 1))
    with pytest.raises(OwnershipLost):
        store.pipelines.take_over(own.pipeline_id, "reexec-1")  # the owner is alive
    new = store.pipelines.take_over(own.pipeline_id, "reexec-1", owner_dead=["run-1"])
    assert (new.epoch, new.owner) == (own.epoch + 1, "reexec-1")
    assert store.pipelines.get_node(own.pipeline_id, "a").status == "pending"
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"k1": 1}  # checkpoints are reused
    with pytest.raises(OwnershipLost):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k2", 2))  # the old owner is fenced out
    store.pipelines.fail_run(new, "permanent")
    again = store.pipelines.take_over(own.pipeline_id, "reexec-2")
    assert again.epoch == new.epoch + 1 and store.pipelines.get_pipeline(own.pipeline_id).status == "running"
    expire(store, own.pipeline_id)
    third = store.pipelines.take_over(own.pipeline_id, "reexec-3")  # heartbeat expired on the database clock
    assert third.epoch == again.epoch + 1
    assert [m[2] for m in moves(store, own.pipeline_id)] == ["created", "taken_over", "failed", "taken_over",
                                                              "taken_over"]
    # each takeover is an event, as a reclaim is: who, from whom, why
    taken = [e for e in store.reports.recent_events(kinds=["pipeline_taken_over"], limit=10)]
    assert [(e["payload"]["owner"], e["payload"]["previous_owner"], e["payload"]["cause"]) for e in taken] == [
        ("reexec-1", "run-1", "owner_run_dead"), ("reexec-2", "reexec-1", "pipeline_failed"),
        ("reexec-3", "reexec-2", "heartbeat")]
    assert taken[0]["payload"]["reset_nodes"] == ["a"] and taken[0]["pipeline_id"] == own.pipeline_id


def test_a_completed_pipeline_is_not_taken_over(store):
    own = make(store, nodes_=("a",))
    store.pipelines.complete_run(own)
    with pytest.raises(OwnershipLost):
        store.pipelines.take_over(own.pipeline_id, "reexec-1", owner_dead=["run-1"])
