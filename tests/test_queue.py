"""The work queue (seed 003) on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from recovery_ext.errors import IllegalTransition, OwnershipLost
from recovery_ext.schema import queue_items


def backdate(store, item_id, *, heartbeat=True, started_ago=None):
    values = {}
    if heartbeat:
        values["heartbeat_deadline"] = store.dialect.now_plus(-1)
    if started_ago is not None:
        values["started_at"] = store.dialect.now_plus(-started_ago)
    with store.write() as conn:
        conn.execute(update(queue_items).where(queue_items.c.id == item_id).values(values))


def test_enqueue_dedupes_and_claim_takes_oldest_first(store):
    first = store.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}], dedupe_keys=["a", "b"])
    assert store.enqueue("ocr", [{"doc": "a"}], dedupe_keys=["a"]) == []
    (item,) = store.claim("ocr", "w1", heartbeat_timeout=60)
    assert item.id == first[0] and item.status == "processing" and item.attempts == 1 and item.worker == "w1"
    assert store.count_ready("ocr") == 1


def test_complete_stores_the_result_and_clears_the_error(store):
    store.enqueue("ocr", [{"doc": "a"}])
    (item,) = store.claim("ocr", "w1")
    store.fail_item(item, "HTTP 503", retryable=True)
    (item,) = store.claim("ocr", "w1")
    store.complete_item(item, {"raw": "x", "boosted": "X"})
    done = store.get_item(item.id)
    assert (done.status, done.result, done.last_error, done.attempts) == ("completed", {"raw": "x", "boosted": "X"},
                                                                           None, 2)
    assert done.completed_at is not None


def test_failures_go_back_to_ready_then_dead_at_max_attempts(store):
    store.enqueue("ocr", [{"doc": "a"}], max_attempts=2)
    (item,) = store.claim("ocr", "w1")
    assert store.fail_item(item, "timeout") == "ready"
    (item,) = store.claim("ocr", "w2")
    assert store.fail_item(item, "timeout token=abc123") == "dead"
    dead = store.get_item(item.id)
    assert dead.status == "dead" and "abc123" not in dead.last_error and dead.last_error_at is not None
    assert store.claim("ocr", "w3") == []
    assert store.count_events("item_dead") == 1


def test_permanent_failure_is_failed_at_once(store):
    store.enqueue("ocr", [{"doc": "a"}], max_attempts=5)
    (item,) = store.claim("ocr", "w1")
    assert store.fail_item(item, "HTTP 401", retryable=False) == "failed"


def test_stale_items_are_reset_with_a_reason_and_max_attempts_become_dead(store):
    ids = store.enqueue("ocr", [{"doc": d} for d in "abc"], max_attempts=2)
    a, b, c = store.claim("ocr", "crashed", limit=3, heartbeat_timeout=600)
    backdate(store, a.id)  # heartbeat expired
    backdate(store, b.id, heartbeat=False, started_ago=900)  # started 15 min ago
    assert [i.id for i in store.stale_items(queue="ocr", older_than_seconds=600)] in ([b.id, a.id], [a.id, b.id])
    reset = {r.id: r for r in store.reset_stale(queue="ocr", older_than_seconds=600)}
    assert set(reset) == {a.id, b.id}
    assert reset[a.id].worker == "crashed" and reset[a.id].new_status == "ready"
    item = store.get_item(a.id)
    assert item.status == "ready" and item.worker is None and "Reset by stale monitor" in item.last_error
    assert item.last_error_at is not None
    assert store.get_item(c.id).status == "processing"
    # second crash of a: now at max attempts -> dead
    (again,) = [i for i in store.claim("ocr", "crashed-again", limit=5) if i.id == a.id]
    backdate(store, again.id)
    (r,) = [r for r in store.reset_stale(queue="ocr") if r.id == a.id]
    assert r.new_status == "dead" and store.get_item(a.id).status == "dead"
    assert set(ids) >= set(reset)


def test_dry_run_lists_without_changing_and_job_id_targets_one(store):
    store.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}])
    a, b = store.claim("ocr", "w", limit=2)
    backdate(store, a.id)
    backdate(store, b.id)
    assert {i.id for i in store.stale_items(queue="ocr")} == {a.id, b.id}
    assert store.get_item(a.id).status == "processing"
    assert [r.id for r in store.reset_stale(item_id=b.id)] == [b.id]
    assert store.get_item(a.id).status == "processing"


def test_a_reset_items_old_worker_can_neither_complete_nor_heartbeat(store):
    store.enqueue("ocr", [{"doc": "a"}])
    (old,) = store.claim("ocr", "old")
    backdate(store, old.id)
    store.reset_stale(queue="ocr")
    (new,) = store.claim("ocr", "new")
    with pytest.raises(OwnershipLost):
        store.complete_item(old, {"raw": "stale"})
    with pytest.raises(OwnershipLost):
        store.heartbeat_item(old, timeout=60)
    store.complete_item(new, {"raw": "fresh"})
    assert store.get_item(new.id).result == {"raw": "fresh"}


def test_retry_dead_resets_attempts_and_records_a_transition(store):
    store.enqueue("ocr", [{"doc": "a"}, {"doc": "b"}], max_attempts=1)
    items = store.claim("ocr", "w", limit=2)
    for item in items:
        store.fail_item(item, "boom")
    assert store.retry_dead([items[0].id]) == [items[0].id]
    again = store.get_item(items[0].id)
    assert (again.status, again.attempts) == ("ready", 0)
    assert any(t["event"] == "manual_retry" for t in store.transitions_for(entity_type="queue_item",
                                                                           entity_id=items[0].id))
    with pytest.raises(IllegalTransition):
        store.retry_dead([items[0].id])
    assert store.retry_dead() == [items[1].id]


def test_queue_summary_counts_and_average_duration(store):
    store.enqueue("ocr", [{"doc": d} for d in "abc"])
    a, b = store.claim("ocr", "w", limit=2)
    store.complete_item(a, {})
    summary = {(r["queue"], r["status"]): r for r in store.queue_summary()}
    assert summary[("ocr", "completed")]["count"] == 1
    assert summary[("ocr", "completed")]["avg_seconds"] >= 0
    assert summary[("ocr", "processing")]["count"] == 1 and summary[("ocr", "ready")]["count"] == 1
