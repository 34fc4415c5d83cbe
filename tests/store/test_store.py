"""The store suite; every test runs on SQLite and on a real PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import func, insert, select, update

from recovery_ext._errors import ConfigurationError, IllegalTransition, NotFound, OwnershipLost, StoreError
from recovery_ext._store.models import ErrorInfo, ItemCheckpoint, NodeSpec, Ownership, PassPlan, PipelineLimits, Scope
from recovery_ext._store.schema import events, nodes, pipelines, transitions

from helpers import expire, reclaim


def count(store, table, *where):
    with store.read() as conn:
        return conn.scalar(select(func.count()).select_from(table).where(*where))


def make(store, owner="run-1", nodes_=("a", "b", "c"), **kw):
    return store.pipelines.create_pipeline("job", list(nodes_), owner=owner, origin_run_id=owner, params={"x": 1}, **kw)


def test_create_pipeline_with_nodes_is_running_and_idempotent_per_run(store):
    own = make(store)
    again = make(store)
    assert again == own
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert (p.status, p.owner, p.epoch, p.params) == ("running", "run-1", 1, {"x": 1})
    assert [n.name for n in store.pipelines.list_nodes(own.pipeline_id)] == ["a", "b", "c"]
    assert {n.status for n in store.pipelines.list_nodes(own.pipeline_id)} == {"pending"}
    with pytest.raises(OwnershipLost):
        store.pipelines.create_pipeline("job", ["a"], owner="someone-else", origin_run_id="run-1")


def test_create_pipeline_holds_the_pipeline_to_its_limits(store):
    own = make(store, limits=PipelineLimits(heartbeat_timeout=600, deadline_seconds=3600, max_resumes=7))
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.max_resumes == 7
    assert round((p.heartbeat_deadline - p.heartbeat_at).total_seconds()) == 600
    assert round((p.deadline - p.created_at).total_seconds()) == 3600
    assert store.pipelines.get_pipeline(make(store, owner="run-2").pipeline_id).deadline is None  # default: no deadline


@pytest.mark.parametrize("limits, message", [
    (dict(heartbeat_timeout=-1), r"heartbeat_timeout must be a finite number of seconds > 0, got -1"),
    (dict(heartbeat_timeout=0), r"heartbeat_timeout must be a finite number of seconds > 0"),
    (dict(heartbeat_timeout=float("inf")), r"heartbeat_timeout must be a finite number of seconds > 0"),
    (dict(deadline_seconds=0), r"deadline_seconds must be a finite number of seconds > 0"),
    (dict(deadline_seconds="1h"), r"deadline_seconds must be a finite number of seconds > 0"),
    (dict(max_resumes=-1), r"max_resumes must be a whole number from 0"),
    (dict(max_resumes=True), r"max_resumes must be a whole number from 0"),
    (dict(max_resumes=2**31 - 1), r"max_resumes must be a whole number from 0"),
])
def test_pipeline_limits_refuse_a_bad_limit_before_anything_is_stored(limits, message):
    with pytest.raises(ConfigurationError, match=message):
        PipelineLimits(**limits)


def test_node_lifecycle_completes_the_pipeline_and_records_transitions(store):
    own = make(store, nodes_=("a", NodeSpec("b", optional=True)))
    store.pipelines.start_node(own, "a")
    assert store.pipelines.complete_node(own, "a", {"rows": 3}) is False
    store.pipelines.start_node(own, "b")
    assert store.pipelines.degrade_node(own, "b", ErrorInfo("llm down", "server_error", 503)) is True
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.status == "completed" and p.completed_at is not None
    a, b = store.pipelines.list_nodes(own.pipeline_id)
    assert (a.status, a.output, a.attempts) == ("completed", {"rows": 3}, 1)
    assert (b.status, b.error_category, b.error_status_code) == ("degraded", "server_error", 503)
    history = [
        (t["entity_type"], t["from_status"], t["to_status"]) for t in store.reports.transitions_for(pipeline_id=p.id)
    ]
    assert ("node", "pending", "running") in history and ("pipeline", "running", "completed") in history


@pytest.mark.parametrize("action", ["complete_pending", "start_running", "start_completed", "degrade_required"])
def test_illegal_transitions_are_refused_and_write_nothing(store, action):
    own = make(store)
    store.pipelines.start_node(own, "b")
    store.pipelines.complete_node(own, "b")
    store.pipelines.start_node(own, "c")
    before = (count(store, transitions), store.pipelines.list_nodes(own.pipeline_id))
    with pytest.raises(IllegalTransition) as info:
        if action == "complete_pending":
            store.pipelines.complete_node(own, "a")
        elif action == "start_running":
            store.pipelines.start_node(own, "c")
        elif action == "start_completed":
            store.pipelines.start_node(own, "b")
        else:
            store.pipelines.degrade_node(own, "c", ErrorInfo("x"))
    assert "not" in str(info.value)
    assert (count(store, transitions), store.pipelines.list_nodes(own.pipeline_id)) == before


def test_permanent_node_failure_fails_the_pipeline(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.fail_node(own, "a", ErrorInfo("auth HTTP 401: bad key ***", "auth", 401), permanent=True)
    p = store.pipelines.get_pipeline(own.pipeline_id)
    assert p.status == "failed" and "401" in p.error
    assert count(store, events, events.c.kind == "pipeline_failed") == 1


def test_transient_node_failure_allows_a_retry(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.fail_node(own, "a", ErrorInfo("HTTP 503", "server_error", 503), permanent=False)
    assert store.pipelines.get_pipeline(own.pipeline_id).status == "running"
    assert store.pipelines.start_node(own, "a").attempts == 2


def test_item_checkpoints_commit_with_the_result_and_list_what_is_pending(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("t1", {"rows": 1}))
    store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("t2", {"rows": 2}))
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {"t1": {"rows": 1}, "t2": {"rows": 2}}
    done = store.pipelines.completed_items(own.pipeline_id, "a")
    assert [key for key in ["t1", "t2", "t3"] if key not in done] == ["t3"]
    with pytest.raises(IllegalTransition):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("t1", {"rows": 9}))
    assert store.pipelines.completed_items(own.pipeline_id, "a")["t1"] == {"rows": 1}


def test_item_checkpoint_rolls_back_the_callers_writes_when_fenced(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=10, launching=True))

    def probe(tx):
        tx.execute(insert(events).values(kind="superseded_write", payload={}))

    with pytest.raises(OwnershipLost):
        store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("t1", 1, also=probe))
    # SQLite checks the fence before the caller's writes; PostgreSQL in the checkpoint statement after
    # them, holding its lock to the commit: either way nothing of the superseded worker commits
    with store.read() as conn:
        assert conn.scalar(select(func.count()).select_from(events).where(events.c.kind == "superseded_write")) == 0
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {}


def test_batched_heartbeat_extends_live_owners_and_reports_lost_ones(store):
    owners = [make(store, owner=f"run-{i}") for i in range(5)]
    for own in owners:
        store.pipelines.start_node(own, "a")
        expire(store, own.pipeline_id)
    expire(store, owners[0].pipeline_id)
    reclaim(store, PassPlan(limit=1, launching=True))  # oldest first: one of them is superseded
    lost_before = [o for o in owners if store.pipelines.get_pipeline(o.pipeline_id).epoch != o.epoch]
    assert len(lost_before) == 1
    lost = store.pipelines.heartbeat([(o, "a") for o in owners], timeout=60)
    assert lost == {lost_before[0].pipeline_id}
    assert store.recovery.find_orphans() == []


def test_orphans_by_heartbeat_by_hard_deadline_and_null_heartbeat_rows(store):
    live = make(store, owner="live")
    stale = make(store, owner="stale")
    expire(store, stale.pipeline_id)
    legacy = make(store, owner="legacy", limits=PipelineLimits(deadline_seconds=3600))
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == legacy.pipeline_id).values(heartbeat_deadline=None))
    legacy_past = make(store, owner="legacy-past", limits=PipelineLimits(deadline_seconds=3600))
    with store.write() as conn:
        conn.execute(update(pipelines).where(pipelines.c.id == legacy_past.pipeline_id)
                     .values(heartbeat_deadline=None, deadline=store.dialect.now_plus(-1)))
    found = {o.id: o.reason for o in store.recovery.find_orphans()}
    assert found == {stale.pipeline_id: "heartbeat", legacy_past.pipeline_id: "deadline"}
    assert live.pipeline_id not in found and legacy.pipeline_id not in found


def test_dead_owner_run_makes_an_orphan_at_once(store):
    make(store, owner="dead-run")
    assert store.recovery.find_orphans() == []
    assert [o.reason for o in store.recovery.find_orphans(dead_owner_runs=["dead-run"])] == ["owner_run_dead"]


def test_stalled_node_makes_an_orphan_even_with_a_live_heartbeat(store):
    own = make(store)
    store.pipelines.start_node(own, "a", heartbeat_timeout=600, stall_timeout=600)
    assert store.recovery.find_orphans() == []
    with store.write() as conn:
        conn.execute(update(nodes).where(nodes.c.pipeline_id == own.pipeline_id, nodes.c.name == "a")
                     .values(stall_deadline=store.dialect.now_plus(-1)))
    assert [o.reason for o in store.recovery.find_orphans()] == ["stalled"]
    store.pipelines.report_progress(own, "a", stall_timeout=600)
    assert store.recovery.find_orphans() == []


def test_reclaim_takes_ownership_resets_running_nodes_and_records_history(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    store.pipelines.complete_node(own, "a", 1)
    store.pipelines.start_node(own, "b")
    expire(store, own.pipeline_id)
    reclaimed, corrupt = reclaim(store, PassPlan(limit=10, launching=True))
    assert corrupt == []
    (r,) = reclaimed
    assert (r.previous_owner, r.epoch, r.resume_number, r.reset_nodes) == ("run-1", 2, 1, ("b",))
    assert r.owner == f"resume-{own.pipeline_id}-1"
    statuses = {n.name: n.status for n in store.pipelines.list_nodes(own.pipeline_id)}
    assert statuses == {"a": "completed", "b": "pending", "c": "pending"}
    assert count(store, events, events.c.kind == "pipeline_recovered") == 1
    assert count(store, transitions, transitions.c.event == "reset_by_recovery") == 1
    # a second reclaim finds nothing: the grace period keeps the new owner safe
    assert reclaim(store, PassPlan(limit=10, launching=True)) == ([], [])
    # the resume run attaches to the reservation
    resumed = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    assert resumed == Ownership(own.pipeline_id, 2, "run-2")
    with pytest.raises(OwnershipLost):
        store.pipelines.attach(own.pipeline_id, "run-3", resume_number=1)


def test_superseded_owner_cannot_heartbeat_checkpoint_progress_or_complete(store):
    own = make(store)
    store.pipelines.start_node(own, "a")
    expire(store, own.pipeline_id)
    reclaim(store, PassPlan(limit=10, launching=True))
    new = store.pipelines.attach(own.pipeline_id, "run-2", resume_number=1)
    before = store.pipelines.get_pipeline(own.pipeline_id)
    assert store.pipelines.heartbeat([(own, "a")], timeout=60) == {own.pipeline_id}
    for write in (
        lambda: store.pipelines.checkpoint_item(own, "a", ItemCheckpoint("k", 1)),
        lambda: store.pipelines.complete_node(own, "a", 1),
        lambda: store.pipelines.report_progress(own, "a", stall_timeout=10),
        lambda: store.pipelines.start_node(own, "b"),
    ):
        with pytest.raises(OwnershipLost) as info:
            write()
        assert "run-2" in str(info.value)
    after = store.pipelines.get_pipeline(own.pipeline_id)
    assert (after.owner, after.epoch, after.heartbeat_deadline) == ("run-2", 2, before.heartbeat_deadline)
    assert store.pipelines.completed_items(own.pipeline_id, "a") == {}
    store.pipelines.start_node(new, "a")
    store.pipelines.complete_node(new, "a", "new")
    assert store.pipelines.get_node(own.pipeline_id, "a").output == "new"


def test_give_up_after_max_resumes_hard_deadline_and_max_age(store):
    resumed_out = make(store, owner="r", limits=PipelineLimits(max_resumes=0))
    expire(store, resumed_out.pipeline_id)
    past_deadline = make(store, owner="d", limits=PipelineLimits(deadline_seconds=3600))
    expire(store, past_deadline.pipeline_id, column="deadline")
    old = make(store, owner="o")
    expire(store, old.pipeline_id)
    expire(store, old.pipeline_id, column="created_at", ago=7200)
    fine = make(store, owner="f")
    expire(store, fine.pipeline_id)
    # a pass that reclaims nothing (limit 0): what the orphan sensor gives up first
    passed = store.recovery.recovery_pass(PassPlan(max_age_seconds=3600, limit=0), Scope())
    given_up = {g.pipeline_id: g.reason for g in passed.given_up}
    assert set(given_up) == {resumed_out.pipeline_id, past_deadline.pipeline_id, old.pipeline_id}
    assert given_up[resumed_out.pipeline_id] == "gave up after 0 resumes (maximum 0)"
    assert "hard deadline" in given_up[past_deadline.pipeline_id]
    assert "maximum age" in given_up[old.pipeline_id]
    for pid in given_up:
        p = store.pipelines.get_pipeline(pid)
        assert p.status == "failed" and p.gave_up_reason
    assert count(store, events, events.c.kind == "pipeline_stuck") == 3
    assert store.pipelines.get_pipeline(fine.pipeline_id).status == "running"


def test_missing_rows_give_clear_errors(store):
    with pytest.raises(NotFound):
        store.pipelines.get_pipeline(424242)
    own = make(store)
    with pytest.raises(NotFound):
        store.pipelines.start_node(own, "nope")
    with pytest.raises(StoreError):
        store.pipelines.create_pipeline("job", [], owner="x")
