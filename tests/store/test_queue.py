"""The work queue (seed 003) on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from recovery_ext._errors import IllegalTransition, OwnershipLost
from recovery_ext._classify.retry import wait_jittered_exponential
from recovery_ext._store.models import PassPlan
from recovery_ext._store.schema import queue_items
from helpers import reclaim

NO_DELAY = wait_jittered_exponential(0.0, max_delay=0.0, jitter=0.0)


def backdate(store, item_id, *, heartbeat=True, started_ago=None):
    """Expire the heartbeat (``heartbeat=None``: a legacy row without one) and/or move the start back."""
    values = {}
    if heartbeat is None:
        values["heartbeat_deadline"] = None
    elif heartbeat:
        values["heartbeat_deadline"] = store.dialect.now_plus(-1)
    if started_ago is not None:
        values["started_at"] = store.dialect.now_plus(-started_ago)
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == item_id).values(values))


def test_enqueue_dedupes_and_claim_takes_oldest_first(store):
    first = store.queue.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}], dedupe_keys=["a", "b"])
    assert store.queue.enqueue("ocr", [{"doc": "a"}], dedupe_keys=["a"]) == []
    (item,) = store.queue.claim("ocr", "w1", heartbeat_timeout=60)
    assert item.id == first[0] and item.status == "processing" and item.attempts == 1 and item.worker == "w1"
    assert store.queue.count_ready("ocr") == 1


def test_complete_stores_the_result_and_clears_the_error(store):
    store.queue.enqueue("ocr", [{"doc": "a"}])
    (item,) = store.queue.claim("ocr", "w1")
    store.queue.fail_item(item, "HTTP 503", retryable=True, backoff=NO_DELAY)
    (item,) = store.queue.claim("ocr", "w1")
    store.queue.complete_item(item, {"raw": "x", "boosted": "X"})
    done = store.queue.get_item(item.id)
    assert (done.status, done.result, done.last_error, done.attempts) == ("completed", {"raw": "x", "boosted": "X"},
                                                                           None, 2)
    assert done.completed_at is not None


def test_failures_go_back_to_ready_then_dead_at_max_attempts(store):
    store.queue.enqueue("ocr", [{"doc": "a"}], max_attempts=2)
    (item,) = store.queue.claim("ocr", "w1")
    assert store.queue.fail_item(item, "timeout", backoff=NO_DELAY) == "ready"
    (item,) = store.queue.claim("ocr", "w2")
    assert store.queue.fail_item(item, "timeout token=abc123") == "dead"
    dead = store.queue.get_item(item.id)
    assert dead.status == "dead" and "abc123" not in dead.last_error and dead.last_error_at is not None
    assert store.queue.claim("ocr", "w3") == []
    assert store.reports.count_events("item_dead") == 1


def test_permanent_failure_is_failed_at_once(store):
    store.queue.enqueue("ocr", [{"doc": "a"}], max_attempts=5)
    (item,) = store.queue.claim("ocr", "w1")
    assert store.queue.fail_item(item, "HTTP 401", retryable=False) == "failed"


def test_stale_items_are_reset_with_a_reason_and_max_attempts_become_dead(store):
    ids = store.queue.enqueue("ocr", [{"doc": d} for d in "abc"], max_attempts=2)
    a, b, c = store.queue.claim("ocr", "crashed", limit=3, heartbeat_timeout=600)
    backdate(store, a.id)  # heartbeat expired
    backdate(store, b.id, heartbeat=None, started_ago=900)  # legacy row without a heartbeat, started 15 min ago
    assert [i.id for i in store.queue.stale_items(queue="ocr", older_than_seconds=600)] in ([b.id, a.id], [a.id, b.id])
    reset = {r.id: r for r in store.queue.reset_stale(queue="ocr", older_than_seconds=600)}
    assert set(reset) == {a.id, b.id}
    assert reset[a.id].worker == "crashed" and reset[a.id].new_status == "ready"
    item = store.queue.get_item(a.id)
    assert item.status == "ready" and item.worker is None and "Reset by stale monitor" in item.last_error
    assert item.last_error_at is not None
    assert store.queue.get_item(c.id).status == "processing"
    # second crash of a: now at max attempts -> dead
    (again,) = [i for i in store.queue.claim("ocr", "crashed-again", limit=5) if i.id == a.id]
    backdate(store, again.id)
    (r,) = [r for r in store.queue.reset_stale(queue="ocr") if r.id == a.id]
    assert r.new_status == "dead" and store.queue.get_item(a.id).status == "dead"
    assert set(ids) >= set(reset)


def test_dry_run_lists_without_changing_and_job_id_targets_one(store):
    store.queue.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}])
    a, b = store.queue.claim("ocr", "w", limit=2)
    backdate(store, a.id)
    backdate(store, b.id)
    assert {i.id for i in store.queue.stale_items(queue="ocr")} == {a.id, b.id}
    assert store.queue.get_item(a.id).status == "processing"
    assert [r.id for r in store.queue.reset_stale(item_id=b.id)] == [b.id]
    assert store.queue.get_item(a.id).status == "processing"


def test_a_reset_items_old_worker_can_neither_complete_nor_heartbeat(store):
    store.queue.enqueue("ocr", [{"doc": "a"}])
    (old,) = store.queue.claim("ocr", "old")
    backdate(store, old.id)
    store.queue.reset_stale(queue="ocr")
    (new,) = store.queue.claim("ocr", "new")
    with pytest.raises(OwnershipLost):
        store.queue.complete_item(old, {"raw": "stale"})
    with pytest.raises(OwnershipLost):
        store.queue.heartbeat_item(old, timeout=60)
    store.queue.complete_item(new, {"raw": "fresh"})
    assert store.queue.get_item(new.id).result == {"raw": "fresh"}


def test_retry_dead_resets_attempts_and_records_a_transition(store):
    store.queue.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}], max_attempts=1)
    items = store.queue.claim("ocr", "w", limit=2)
    for item in items:
        store.queue.fail_item(item, "boom")
    assert store.queue.retry_dead([items[0].id]) == [items[0].id]
    again = store.queue.get_item(items[0].id)
    assert (again.status, again.attempts) == ("ready", 0)
    assert any(t["event"] == "manual_retry" for t in store.reports.transitions_for(entity_type="queue_item",
                                                                           entity_id=items[0].id))
    with pytest.raises(IllegalTransition):
        store.queue.retry_dead([items[0].id])
    assert store.queue.retry_dead() == [items[1].id]


def test_queue_summary_counts_and_average_duration(store):
    store.queue.enqueue("ocr", [{"doc": d} for d in "abc"])
    a, b = store.queue.claim("ocr", "w", limit=2)
    store.queue.complete_item(a, {})
    summary = {(r["queue"], r["status"]): r for r in store.reports.queue_summary()}
    assert summary[("ocr", "completed")]["count"] == 1
    assert summary[("ocr", "completed")]["avg_seconds"] >= 0
    assert summary[("ocr", "processing")]["count"] == 1 and summary[("ocr", "ready")]["count"] == 1


# -- staleness: the heartbeat decides; seed 003's started-at threshold only for rows without one ------------

def test_a_document_slower_than_the_stale_threshold_that_keeps_heartbeating_is_never_reset(store):
    store.queue.enqueue("ocr", [{"doc": "slow"}])
    (item,) = store.queue.claim("ocr", "w1", heartbeat_timeout=60)
    backdate(store, item.id, heartbeat=False, started_ago=3600)  # started an hour ago, heartbeat still live
    store.queue.heartbeat_item(item, timeout=60)
    assert (
        store.queue.stale_items(queue="ocr") == [] and store.queue.stale_items(queue="ocr", older_than_seconds=1) == []
    )
    assert store.queue.reset_stale(queue="ocr") == [] and store.queue.claim("ocr", "w2") == []
    assert store.queue.complete_item(item, {"raw": "done"}) == "processing"
    done = store.queue.get_item(item.id)
    assert (done.status, done.attempts, done.result) == ("completed", 1, {"raw": "done"})
    assert [t["event"] for t in store.reports.transitions_for(entity_type="queue_item", entity_id=item.id)] == [
        "claimed", "completed"]


def test_the_started_at_threshold_applies_only_to_rows_without_a_heartbeat_deadline(store):
    store.queue.enqueue("ocr", [{"doc": d} for d in "abc"])
    old, young, live = store.queue.claim("ocr", "legacy", limit=3)
    backdate(store, old.id, heartbeat=None, started_ago=900)
    backdate(store, young.id, heartbeat=None, started_ago=300)
    backdate(store, live.id, heartbeat=False, started_ago=900)
    (stale,) = store.queue.stale_items(queue="ocr")
    assert stale.id == old.id and "no heartbeat deadline" in stale.stale_reason
    assert [i.id for i in store.queue.stale_items(queue="ocr", older_than_seconds=120)] == [old.id, young.id]
    (taken,) = store.queue.claim("ocr", "new")  # the claim uses the same rule
    assert (taken.id, taken.attempts, taken.worker) == (old.id, 2, "new")


def test_a_failing_document_waits_a_jittered_exponential_delay_before_its_retry(store):
    import random

    (item_id,) = store.queue.enqueue("ocr", [{"doc": "flaky"}], max_attempts=4)
    backoff = wait_jittered_exponential(100.0, max_delay=1000.0, jitter=0.1, rng=random.Random(7))
    same_draws = wait_jittered_exponential(100.0, max_delay=1000.0, jitter=0.1, rng=random.Random(7))
    expected = [same_draws.delay(n) for n in (1, 2, 3)]
    waits = []
    for attempt in (1, 2, 3):
        (item,) = store.queue.claim("ocr", f"w{attempt}")
        assert item.attempts == attempt and item.available_at is None
        assert store.queue.fail_item(item, "TimeoutError: OCR engine timed out", backoff=backoff) == "ready"
        waiting = store.queue.get_item(item_id)
        waits.append((waiting.available_at - waiting.last_error_at).total_seconds())
        assert store.queue.claim("ocr", "eager") == []  # not before available_at
        assert store.queue.count_ready("ocr") == 0 and store.queue.count_ready("ocr", waiting=True) == 1
        assert 0 < store.queue.seconds_until_claimable("ocr") <= waits[-1]
        with store.write() as conn:  # time passes (on the database clock)
            conn.execute(update(queue_items).where(queue_items.c.id == item_id)
                         .values(available_at=store.dialect.now_plus(-0.001)))
    assert waits == pytest.approx(expected, abs=0.01)
    assert 90 <= waits[0] <= 110 and 180 <= waits[1] <= 220 and 360 <= waits[2] <= 440
    (last,) = store.queue.claim("ocr", "w4")
    assert store.queue.fail_item(last, "timeout", backoff=backoff) == "dead"  # attempts and dead as before
    dead = store.queue.get_item(item_id)
    assert (dead.status, dead.attempts, dead.available_at) == ("dead", 4, None)


def test_an_expired_processing_item_is_claimed_again_in_one_transition_counting_an_attempt(store):
    store.queue.enqueue("ocr", [{"doc": "a"}], max_attempts=2)
    (first,) = store.queue.claim("ocr", "crashed")
    backdate(store, first.id)
    (again,) = store.queue.claim("ocr", "rescuer")
    assert (again.id, again.worker, again.attempts, again.status) == (first.id, "rescuer", 2, "processing")
    claims = [t for t in store.reports.transitions_for(entity_type="queue_item", entity_id=first.id)]
    assert [(t["from_status"], t["to_status"], t["event"]) for t in claims] == [
        ("ready", "processing", "claimed"), ("processing", "processing", "claimed_stale")]
    assert claims[1]["data"]["previous_worker"] == "crashed"
    backdate(store, again.id)  # crashed again, now at max attempts: dead, not claimed a third time
    assert store.queue.claim("ocr", "third") == []
    assert store.queue.get_item(first.id).status == "dead" and store.reports.count_events("item_dead") == 1


def test_a_late_result_of_a_reset_item_nobody_took_over_is_kept(store):
    store.queue.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}])
    a, b = store.queue.claim("ocr", "slow", limit=2)
    backdate(store, a.id)
    backdate(store, b.id)
    store.queue.reset_stale(queue="ocr")
    assert store.queue.complete_item(a, {"raw": "late"}) == "ready"
    assert (store.queue.get_item(a.id).status, store.queue.get_item(a.id).result) == ("completed", {"raw": "late"})
    store.queue.heartbeat_item(b, timeout=60)  # alive after all: takes its item back, no new attempt
    back = store.queue.get_item(b.id)
    assert (back.status, back.worker, back.attempts) == ("processing", "slow", 1)
    assert store.queue.claim("ocr", "other") == []


# -- the pipeline fence --------------------------------------------------------------------------------------

def reclaim_and_attach(store, pipeline_id, run_id):
    from helpers import expire

    expire(store, pipeline_id)
    (reclaimed,), _ = reclaim(store, PassPlan(limit=5, launching=True))
    return store.pipelines.attach(pipeline_id, run_id, resume_number=reclaimed.resume_number)


def test_a_superseded_runs_claim_heartbeat_completion_and_failure_are_refused(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    store.queue.enqueue("ocr", [{"doc": d} for d in "abc"], own=own)
    a, b = store.queue.claim("ocr", "run-1:1", limit=2, own=own)
    assert (a.holder_pipeline_id, a.holder_epoch) == (own.pipeline_id, 1)
    new = reclaim_and_attach(store, own.pipeline_id, "run-2")
    for write in (
        lambda: store.queue.claim("ocr", "run-1:1", own=own),
        lambda: store.queue.heartbeat_item(a, timeout=60),
        lambda: store.queue.complete_item(a, {"raw": "zombie"}),
        lambda: store.queue.fail_item(b, "boom"),
        lambda: store.queue.enqueue("ocr", [{"doc": "z"}], own=own),
    ):
        with pytest.raises(OwnershipLost) as refused:
            write()
        assert type(refused.value) is OwnershipLost  # the pipeline's fence, not another worker
    assert {i.status for i in store.queue.list_items("ocr")} == {"processing", "ready"} and len(
        store.queue.list_items("ocr")
    ) == 3
    assert {i.id for i in store.queue.stale_items(queue="ocr")} == {a.id, b.id}  # held by a superseded epoch
    assert "reclaimed" in store.queue.stale_items(queue="ocr")[0].stale_reason
    taken = store.queue.claim("ocr", "run-2:1", limit=3, own=new)
    assert {(i.holder_epoch, i.attempts) for i in taken} == {(2, 2), (2, 1)}


def test_documents_held_by_any_superseded_run_are_released_not_only_the_direct_predecessor(store):
    own = store.pipelines.create_pipeline("ocr_documents", ["ocr_documents"], owner="run-1")
    store.queue.enqueue("ocr", [{"doc": d} for d in "ab"], own=own)
    held = store.queue.claim("ocr", "run-1:1", limit=2, own=own, heartbeat_timeout=600)
    first_resume = reclaim_and_attach(store, own.pipeline_id, "run-2")  # crashed before its OCR step started
    second_resume = reclaim_and_attach(store, own.pipeline_id, "run-3")
    assert second_resume.epoch == 3 and first_resume.epoch == 2
    released = store.queue.release_superseded(second_resume, queue="ocr")
    assert sorted(r.id for r in released) == sorted(i.id for i in held)
    assert {r.new_status for r in released} == {"ready"} and {r.worker for r in released} == {"run-1:1"}
    with pytest.raises(OwnershipLost):
        store.queue.release_superseded(first_resume, queue="ocr")
    for item in store.queue.claim("ocr", "run-3:1", limit=2, own=second_resume):
        store.queue.complete_item(item, {"raw": "ok"})
    for item in held:
        with pytest.raises(OwnershipLost):
            store.queue.complete_item(item, {"raw": "zombie"})
    assert {i.status for i in store.queue.list_items("ocr")} == {"completed"}
    completions = [t for t in store.reports.transitions_for(entity_type="queue_item") if t["to_status"] == "completed"]
    assert sorted(t["entity_id"] for t in completions) == sorted(i.id for i in held)


def test_another_worker_taking_over_is_reported_as_such(store):
    from recovery_ext._errors import ItemTakenOver

    store.queue.enqueue("ocr", [{"doc": "a"}])
    (old,) = store.queue.claim("ocr", "old")
    backdate(store, old.id)
    (new,) = store.queue.claim("ocr", "new")
    with pytest.raises(ItemTakenOver, match="processing under new"):
        store.queue.complete_item(old, {"raw": "stale"})
    store.queue.complete_item(new, {"raw": "fresh"})
    with pytest.raises(ItemTakenOver, match="completed under new"):
        store.queue.fail_item(old, "boom")
